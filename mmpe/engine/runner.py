"""MMEngine's Runner with mmpe's runtime guarantees, whatever the launcher.

``configs/_base_/runtime_mmpe.py`` sets ``runner_type = 'MMPERunner'``;
mmdet's and mmseg's ``tools/train.py`` (and ``mim train``, which runs them)
build the runner with ``RUNNERS.build(cfg)`` when a config names one, and
mmpe's ``tools/train.py`` / ``tools/test.py`` set it on configs that do not.
What a config cannot declare happens here, in MMEngine's own extension
points:

* :meth:`MMPERunner.from_cfg` completes the config
  (:func:`~mmpe.engine.runtime.complete_runtime`: atomic checkpoints,
  mid-epoch resume, the runtime hooks) and says what it changed in one log
  line;
* :meth:`~MMPERunner.train`, :meth:`~MMPERunner.val` and
  :meth:`~MMPERunner.test` run inside
  :func:`~mmpe.engine.safe_checkpoint_loading`: every checkpoint the run
  loads (``load_from``, ``--resume``, ``init_cfg`` of type ``Pretrained``)
  is read weights-only, stock-MMEngine and old-mmpe ones included;
* :meth:`~MMPERunner.load_or_resume`, which ``Runner.train`` calls after
  the ``before_run`` hooks and before ``before_train``, picks the checkpoint
  ``--resume`` continues from: without a path the newest one that loads
  (:func:`~mmpe.engine.find_resumable_checkpoint`; rank 0 decides, the
  others follow), with a path only if it loads; otherwise the run stops
  with exit status 2 (:class:`~mmpe.engine.exit_status.BadInput`).

mmpe's tools call :func:`use_mmpe_runner` on a config before building its
runner (:func:`build_tool_runner`).
"""
import copy
from typing import Callable, List, Optional, Tuple

from mmdet.registry import RUNNERS as MMDET_RUNNERS
from mmengine.config import Config
from mmengine.dist import broadcast_object_list, is_main_process
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from ..utils import fix_worker_settings, prepare_cpu_distributed
from .exit_status import BadInput
from .resume_checkpoint import (checkpoint_dirs, checkpoint_load_error,
                                find_resumable_checkpoint)
from .runtime import RUNNER, complete_runtime
from .safe_checkpoint import UnsafeCheckpointError, safe_checkpoint_loading


# MMEngine's root registry: found from every scope (mmdet, mmseg, none)
@RUNNERS.register_module()
class MMPERunner(Runner):
    """``Runner`` that completes its config with mmpe's runtime pieces,
    loads checkpoints weights-only and resumes from the newest checkpoint
    that loads; same arguments as ``Runner``."""

    @classmethod
    def from_cfg(cls, cfg) -> 'MMPERunner':
        cfg = copy.deepcopy(cfg)
        changes = complete_runtime(cfg)
        runner = super().from_cfg(cfg)
        if changes:
            runner.logger.info('mmpe runtime: ' + '; '.join(changes) + '.')
        return runner

    def train(self):
        with safe_checkpoint_loading():
            return super().train()

    def val(self) -> dict:
        with safe_checkpoint_loading():
            return super().val()

    def test(self) -> dict:
        with safe_checkpoint_loading():
            return super().test()

    def load_or_resume(self) -> None:
        if not self._has_loaded and self._resume:
            path, notes, error = self._resume_point()
            for note in notes:
                self.logger.warning(f'--resume: {note}')
            if error is not None:
                self.logger.error(error)
                raise BadInput(error)
            if path is not None:
                self.logger.info(f'--resume: continuing from {path}')
            # None: nothing to resume from, a fresh start (MMEngine would
            # follow a `last_checkpoint` that names a missing file)
            self._load_from, self._resume = path, path is not None
        super().load_or_resume()

    def _resume_point(self) -> Tuple[Optional[str], List[str], Optional[str]]:
        """(checkpoint or None, notes, error or None), decided by rank 0."""
        decision = [None]
        if is_main_process():
            decision = [self._choose_resume_point()]
        broadcast_object_list(decision)
        return decision[0]

    def _choose_resume_point(
            self) -> Tuple[Optional[str], List[str], Optional[str]]:
        path = self._load_from
        try:
            if path is not None:  # --resume PATH
                reason = None if '://' in path else checkpoint_load_error(path)
                if reason is not None:
                    return None, [], f'cannot resume from {path}: {reason}'
                return path, [], None
            path, notes = find_resumable_checkpoint(
                self.work_dir, checkpoint_dirs(self.cfg))
        except UnsafeCheckpointError as err:
            return None, [], str(err)
        except RuntimeError as err:  # there are checkpoints, none loads
            return None, [], f'cannot resume: {err}'
        return path, notes, None


def use_mmpe_runner(cfg: Config) -> List[str]:
    """For mmpe's tools: make ``cfg`` build :class:`~mmpe.engine.MMPERunner`.

    A config that names no runner gets ``runner_type = 'MMPERunner'`` (the
    runner completes it and logs the one line). A config that names
    another runner is completed here, since that runner will not.

    Args:
        cfg (Config): A full config; changed in place.

    Returns:
        list[str]: Lines for the user (empty unless another runner).
    """
    kind = cfg.get('runner_type', None)
    if kind is None:
        cfg.runner_type = RUNNER
        return []
    cls = kind if isinstance(kind, type) else RUNNERS.get(kind)
    if isinstance(cls, type) and issubclass(cls, MMPERunner):
        return []
    changes = complete_runtime(cfg)
    lines = ['mmpe runtime: ' + '; '.join(changes) + '.'] if changes else []
    name = getattr(kind, '__name__', kind)
    return lines + [
        f'warning: the config builds runner {name!r}, not {RUNNER}: '
        '--resume follows last_checkpoint without skipping a checkpoint '
        'that does not load'
    ]


def build_tool_runner(cfg: Config, launcher: str,
                      say: Callable[[str], None] = print) -> Runner:
    """The runner of ``tools/train.py`` and ``tools/test.py``:
    :func:`use_mmpe_runner` (its lines to ``say``), the data workers'
    settings fixed and CPU-only DDP prepared
    (:func:`~mmpe.utils.fix_worker_settings`,
    :func:`~mmpe.utils.prepare_cpu_distributed`), then built from
    ``cfg.runner_type`` through mmdet's registry, as mmdet's tools build it.
    """
    for note in use_mmpe_runner(cfg):
        say(note)
    fix_worker_settings(cfg)
    prepare_cpu_distributed(cfg, launcher)
    return MMDET_RUNNERS.build(cfg)
