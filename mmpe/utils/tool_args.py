"""The command-line options that mmpe's tools share (``tools/train.py``,
``tools/test.py``, ``tools/deployment/export_onnx.py``, the analysis tools),
each written once with what it does to the config: a config's
``--cfg-options``, the trusted-checkpoint opt-in
``--allow-unsafe-checkpoint``, the launcher flags of mmdet's
``tools/train.py`` / ``tools/test.py`` (``--launcher``, ``--local-rank``),
``--work-dir`` and the detections file of ``--out``.
"""
import argparse
import os
import os.path as osp
from typing import Optional, Sequence

from mmengine.config import Config, DictAction

LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi')


def add_cfg_options(parser: argparse.ArgumentParser) -> None:
    """``--cfg-options key=value ...``: settings merged into the config."""
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override settings in the config, key=value pairs')


def add_unsafe_checkpoint(parser: argparse.ArgumentParser) -> None:
    """``--allow-unsafe-checkpoint``: the tool passes it on as
    ``safe_checkpoint_loading(allow_unsafe=True)``
    (:mod:`mmpe.engine.safe_checkpoint`)."""
    parser.add_argument(
        '--allow-unsafe-checkpoint',
        action='store_true',
        help='load trusted checkpoints that need full unpickling (this can '
        'run code stored in the file)')


def add_launcher(parser: argparse.ArgumentParser) -> None:
    """``--launcher`` and ``--local-rank`` (``--local_rank``), as mmdet's
    tools; :func:`parse_tool_args` exports the rank."""
    parser.add_argument(
        '--launcher', choices=LAUNCHERS, default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def add_runner_args(parser: argparse.ArgumentParser) -> None:
    """The options ``tools/train.py`` and ``tools/test.py`` end with:
    ``--allow-unsafe-checkpoint``, ``--cfg-options``, ``--launcher``,
    ``--local-rank``."""
    add_unsafe_checkpoint(parser)
    add_cfg_options(parser)
    add_launcher(parser)


def parse_tool_args(parser: argparse.ArgumentParser,
                    argv: Optional[Sequence[str]] = None
                    ) -> argparse.Namespace:
    """Parse ``argv``; with launcher flags, ``LOCAL_RANK`` is set from
    ``--local-rank`` unless the launcher (torchrun) set it, as mmdet's
    tools do (MMEngine's ``init_dist`` reads it)."""
    args = parser.parse_args(argv)
    if hasattr(args, 'local_rank') and 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """The config file ``path`` with ``--cfg-options`` merged."""
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def default_work_dir(config_path: str) -> str:
    """``./work_dirs/<config name>``: mmdet's work dir of a config that
    names none."""
    return osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])


def runner_config(args: argparse.Namespace) -> Config:
    """The config of ``tools/train.py`` / ``tools/test.py`` as mmdet's
    tools make it: the launcher, ``--cfg-options``, then the work dir
    (``--work-dir``, else the config's, else :func:`default_work_dir`)."""
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = default_work_dir(args.config)
    return cfg


def dump_detections(cfg: Config, out: str) -> None:
    """``--out`` of a detection test: mmdet's ``DumpDetResults`` appended
    to the test evaluators, writing the predictions to ``out``.

    Raises:
        ValueError: If ``out`` is not a ``.pkl`` / ``.pickle`` file.
    """
    if not out.endswith(('.pkl', '.pickle')):
        raise ValueError(f'--out must be a .pkl or .pickle file, got {out!r}')
    evaluators = cfg.test_evaluator
    cfg.test_evaluator = [evaluators] if isinstance(evaluators,
                                                    dict) else list(evaluators)
    cfg.test_evaluator.append(dict(type='DumpDetResults', out_file_path=out))
