"""MMEngine's ``CheckpointHook`` with crash-safe writes.

Stock ``CheckpointHook`` (MMEngine 0.10) writes each checkpoint into its
final path and the ``last_checkpoint`` pointer with ``open(..., 'w')``; a
job killed during either write leaves a truncated file that ``--resume``
then trips over. It also deletes the oldest kept checkpoint *before* writing
the new one, so with ``max_keep_ckpts=1`` a kill during the write leaves no
checkpoint at all. This subclass, for checkpoints in a local directory:

* writes every checkpoint (periodic, best, published, and the preemption
  checkpoint of :class:`~mmpe.engine.PreemptionHook`) and the pointer through
  :class:`~mmpe.engine.AtomicLocalBackend` (temporary file, fsync,
  ``os.replace``): a name holds either the previous or the new file;
* deletes checkpoints beyond ``max_keep_ckpts`` only after the new one is
  in place (the saved ``keep_ckpt_ids`` are the same as stock's);
* removes temporary files a killed run left in the checkpoint directory
  before training starts.

Everything else (arguments, file names, the message hub's ``last_ckpt`` /
``keep_ckpt_ids`` / best-checkpoint records) is ``CheckpointHook``'s. For
other storage (``out_dir`` on a remote backend, or explicit
``backend_args``) it behaves exactly as ``CheckpointHook`` and says once that
writes there are not atomic.

:class:`~mmpe.engine.MMPERunner` (the runner of
``configs/_base_/runtime_mmpe.py``) uses it in place of
``default_hooks.checkpoint`` of type ``CheckpointHook``; with another
runner::

    default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', ...))
"""
import glob
import hashlib
import logging
import os
import os.path as osp
import pickle

from mmengine.dist import is_main_process, master_only
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log

from mmdet.registry import HOOKS
from ..utils.atomic_files import is_temporary_name
from .atomic_file_backend import ATOMIC_BACKEND, AtomicLocalBackend


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` whose local writes are atomic; same arguments."""

    def before_train(self, runner) -> None:
        super().before_train(runner)
        self.atomic = (
            self.backend_args is None and self.file_client_args is None
            and type(self.file_backend) is LocalBackend)
        if not self.atomic:
            print_log(
                'AtomicCheckpointHook: checkpoints go to a non-local or '
                'explicitly configured storage backend; they are written as '
                'CheckpointHook writes them, not atomically.',
                logger='current',
                level=logging.WARNING)
            return
        self.backend_args = dict(backend=ATOMIC_BACKEND)
        self.file_backend = AtomicLocalBackend()
        if is_main_process():
            self._remove_stale_temporaries(runner)

    def _remove_stale_temporaries(self, runner) -> None:
        dirs = {str(self.out_dir), runner.work_dir}
        for d in sorted(dirs):
            for path in glob.glob(osp.join(d, '.*')):
                if is_temporary_name(path) and osp.isfile(path):
                    os.remove(path)
                    print_log(
                        f'Removed {path}: the partial write of a killed run.',
                        logger='current')

    def _write_pointer(self, runner) -> None:
        if not is_main_process():
            return
        path = osp.join(runner.work_dir, 'last_checkpoint')
        if getattr(self, 'atomic', False):
            self.file_backend.put_text(str(self.last_ckpt), path)
        else:  # as CheckpointHook
            with open(path, 'w') as f:
                f.write(str(self.last_ckpt))

    def _save_checkpoint_with_step(self, runner, step, meta):
        if not getattr(self, 'atomic', False):
            return super()._save_checkpoint_with_step(runner, step, meta)
        # the same bookkeeping as CheckpointHook, but the file that leaves
        # the kept set is removed after the new one is written
        dropped = None
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and
                                            self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                dropped = self.keep_ckpt_ids.popleft()
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids',
                                           list(self.keep_ckpt_ids))

        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir,
                                                     ckpt_filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(
            self.out_dir,
            ckpt_filename,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            backend_args=self.backend_args,
            **self.args)
        if not is_main_process():
            return
        self._write_pointer(runner)
        if dropped is not None and dropped != step:
            path = self.file_backend.join_path(
                self.out_dir, self.filename_tmpl.format(dropped))
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)
            elif self.file_backend.isdir(path):
                self.file_backend.rmtree(path)

    @master_only
    def _publish_model(self, runner, ckpt_path: str) -> None:
        """Write the ``published_keys`` of ``ckpt_path`` to
        ``<name>-<sha256[:8]>.pth``, as CheckpointHook names it."""
        if not getattr(self, 'atomic', False):
            return super()._publish_model(runner, ckpt_path)
        from mmengine.runner.checkpoint import (_load_checkpoint,
                                                save_checkpoint)
        checkpoint = _load_checkpoint(ckpt_path, map_location='cpu')
        dropped = [k for k in checkpoint if k not in self.published_keys]
        for key in dropped:
            checkpoint.pop(key)
        if dropped:
            print_log(
                f'Keys {dropped} are left out of the published checkpoint '
                '(not in published_keys).',
                logger='current')
        sha = hashlib.sha256(pickle.dumps(checkpoint)).hexdigest()
        final_path = osp.splitext(ckpt_path)[0] + f'-{sha[:8]}.pth'
        save_checkpoint(checkpoint, final_path, backend_args=self.backend_args)
        print_log(
            f'The checkpoint ({ckpt_path}) is published to {final_path}.',
            logger='current')

    def save_resumable(self, runner, filename: str) -> str:
        """Write a full checkpoint of the current iteration now.

        Used by :class:`~mmpe.engine.PreemptionHook` between iterations: the
        checkpoint holds optimizer and scheduler states and ``meta`` with the
        current epoch and the number of finished iterations (what
        ``Runner.resume`` restores), becomes ``last_checkpoint`` and is not
        part of the ``max_keep_ckpts`` rotation.

        Args:
            runner (Runner): The runner.
            filename (str): File name inside the checkpoint directory.

        Returns:
            str: The checkpoint's path.
        """
        self.last_ckpt = self.file_backend.join_path(self.out_dir, filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(
            self.out_dir,
            filename,
            save_optimizer=True,
            save_param_scheduler=True,
            by_epoch=False,
            backend_args=self.backend_args,
            **self.args)
        self._write_pointer(runner)
        return self.last_ckpt
