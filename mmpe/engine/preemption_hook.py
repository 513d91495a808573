"""Save a checkpoint and stop when the scheduler announces preemption.

Cluster schedulers warn a job before they kill it: Slurm sends ``SIGTERM``
when it preempts or cancels a job (then ``SIGKILL`` after its grace time),
and the signal of ``srun --signal=USR1@120`` shortly before the time limit.
Without a handler Python dies at once on ``SIGTERM`` and the job loses
everything since the last epoch checkpoint.

:class:`PreemptionHook` catches the configured signals during training. The
handler only records the signal; at the next iteration boundary (after every
other hook's ``after_train_iter``, so the scheduler step and the logs of that
iteration are done) all ranks agree that a signal came (a max all-reduce of
one integer when distributed, so they stop at the same iteration), the main
process writes a full checkpoint ``iter_{N}.pth`` through
:meth:`AtomicCheckpointHook.save_resumable
<mmpe.engine.AtomicCheckpointHook.save_resumable>` (``N`` finished
iterations; it becomes ``last_checkpoint``), all ranks wait for that write,
and the hook raises :class:`TrainingPreempted`, a ``SystemExit`` with the
status :data:`PREEMPTED_EXIT_CODE` (75, ``EX_TEMPFAIL``: "try again later")
under any launcher (see :mod:`mmpe.engine.exit_status`), which
``tools/slurm_train.sh`` answers by requeueing; the next ``--resume``
continues at iteration ``N + 1``, also in the middle of an epoch
(:class:`~mmpe.engine.ResumableEpochBasedTrainLoop`).

Handlers are installed in ``before_train`` (main thread only) and the
previous ones put back in ``after_train`` or before the hook raises.
Slurm signals every process of a step, dataloader workers too, which would
end them (torch's ``SIGTERM`` handler) before the iteration boundary; so
the hook also wraps the ``worker_init_fn`` of the train and val loaders in
:class:`~mmpe.engine.preemption_workers.SignalTolerantWorkerInit`: workers
ignore these signals while the main process trains, and stop on them again
once training ended, was preempted or failed.

``configs/_base_/runtime_mmpe.py`` declares it (and
:class:`~mmpe.engine.MMPERunner` adds it to configs without it); to choose
the signals::

    custom_hooks = [dict(type='PreemptionHook', signals=('SIGUSR1', ))]
"""
import atexit
import logging
import signal
import threading
from typing import Dict, Optional, Sequence

import torch
from mmengine.dist import all_reduce, barrier
from mmengine.hooks import Hook
from mmengine.logging import print_log

from mmdet.registry import HOOKS
from .atomic_checkpoint_hook import AtomicCheckpointHook
from .exit_status import PREEMPTED_EXIT_CODE, RunStopped
from .preemption_workers import SignalTolerantWorkerInit, TrainingFlag

#: Signals a scheduler uses to announce preemption or the time limit.
PREEMPTION_SIGNALS = ('SIGTERM', 'SIGUSR1', 'SIGUSR2', 'SIGINT', 'SIGHUP',
                      'SIGCONT', 'SIGXCPU')


class TrainingPreempted(RunStopped):
    """Raised after the preemption checkpoint is written; ends the process
    with :data:`PREEMPTED_EXIT_CODE` unless caught.

    Attributes:
        checkpoint (str | None): Path of that checkpoint.
        signal_name (str): The signal that asked for it.
    """

    status = PREEMPTED_EXIT_CODE

    def __init__(self, checkpoint: Optional[str], signal_name: str):
        super().__init__(f'training stopped on {signal_name}; resume from '
                         f'{checkpoint}')
        self.checkpoint = checkpoint
        self.signal_name = signal_name


@HOOKS.register_module()
class PreemptionHook(Hook):
    """On a preemption signal, checkpoint at the next iteration and stop.

    Args:
        signals (Sequence[str]): Signal names to catch, from
            :data:`PREEMPTION_SIGNALS`. Defaults to ``('SIGTERM',
            'SIGUSR1')``.
    """

    priority = 'LOWEST'

    def __init__(self, signals: Sequence[str] = ('SIGTERM', 'SIGUSR1')):
        if isinstance(signals, str):
            signals = (signals, )
        signals = tuple(signals)
        for name in signals:
            if name not in PREEMPTION_SIGNALS or not hasattr(signal, name):
                raise ValueError(f'Unsupported `signals` entry {name!r}, '
                                 f'please choose from {PREEMPTION_SIGNALS}')
        if not signals:
            raise ValueError('`signals` is empty, please choose from '
                             f'{PREEMPTION_SIGNALS}')
        self.signals = signals
        self.received: Optional[str] = None
        self._previous: Dict[int, object] = {}
        self._training = TrainingFlag()

    def _handle(self, signum, frame) -> None:
        # only record: the checkpoint is written between iterations
        if self.received is None:
            self.received = signal.Signals(signum).name

    def before_train(self, runner) -> None:
        if threading.current_thread() is not threading.main_thread():
            print_log(
                'PreemptionHook: training runs outside the main thread, '
                'where signal handlers cannot be installed; preemption '
                'signals will not save a checkpoint.',
                logger='current',
                level=logging.WARNING)
            return
        for name in self.signals:
            signum = getattr(signal, name)
            self._previous[signum] = signal.signal(signum, self._handle)
        self._protect_workers(runner)
        print_log(
            f'PreemptionHook: on {", ".join(self.signals)} a checkpoint is '
            f'saved after the current iteration and training exits with '
            f'status {PREEMPTED_EXIT_CODE}.',
            logger='current')

    def _protect_workers(self, runner) -> None:
        """Let the loaders' workers (not started yet) outlive the signals
        while training; atexit runs before multiprocessing's own exit
        handler, so a failed run's workers still stop on its SIGTERM."""
        loops = [runner.train_loop, getattr(runner, 'val_loop', None)]
        for loop in loops:
            loader = getattr(loop, 'dataloader', None)
            if (loader is None or not getattr(loader, 'num_workers', 0)
                    or isinstance(loader.worker_init_fn,
                                  SignalTolerantWorkerInit)):
                continue
            loader.worker_init_fn = SignalTolerantWorkerInit(
                self.signals, self._training, loader.worker_init_fn,
                loader.num_workers)
        self._training.set(True)
        atexit.register(self._training.set, False)

    def _restore(self) -> None:
        self._training.set(False)
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def after_train(self, runner) -> None:
        self._restore()

    def _signalled_anywhere(self) -> bool:
        flag = torch.tensor([int(self.received is not None)])
        all_reduce(flag, op='max')
        return bool(flag.item())

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        if not self._signalled_anywhere():
            return
        name = self.received or 'a signal on another rank'
        ckpt_hooks = [
            h for h in runner.hooks if isinstance(h, AtomicCheckpointHook)
        ]
        path = None
        if ckpt_hooks:
            path = ckpt_hooks[0].save_resumable(
                runner, f'iter_{runner.iter + 1}.pth')
            runner.logger.warning(
                f'Received {name}: saved {path} after iteration '
                f'{runner.iter + 1}; exiting with status '
                f'{PREEMPTED_EXIT_CODE}. Resume with --resume.')
        else:
            runner.logger.warning(
                f'Received {name}, but the config has no '
                'AtomicCheckpointHook to save with: exiting without a '
                'checkpoint.')
        barrier()  # no rank exits while the main process still writes
        self._restore()
        raise TrainingPreempted(path, name)
