"""Dataloader workers that outlive a preemption signal sent to every process.

Slurm delivers ``SIGTERM`` to every process of a job step, dataloader
workers included. torch's workers install a C handler that ends them on
``SIGTERM`` (and ``SIGUSR1`` ends a process by default), so without help
the main process fails with "DataLoader worker ... is killed by signal"
before :class:`~mmpe.engine.PreemptionHook` writes its checkpoint at the
next iteration boundary.

:class:`SignalTolerantWorkerInit` wraps a loader's ``worker_init_fn``. In
each worker, after torch's handlers, it installs a handler for the
preemption signals that ignores them while a flag in shared memory says the
main process is training, and otherwise does what the signal does by
default. The main process clears the flag when training ends, is preempted
or fails (``atexit``, which runs before ``multiprocessing`` terminates
daemonic children at exit), so workers still stop on the ``SIGTERM`` of a
shutdown; a worker whose main process dies stops by torch's own watchdog.
"""
import os
import signal
from multiprocessing.sharedctypes import RawValue
from typing import Callable, Optional, Sequence


class TrainingFlag:
    """A byte in shared memory: 1 while the main process trains.

    Created before the workers start, so forked workers share it and
    spawned ones receive it when they are started.
    """

    def __init__(self):
        self._value = RawValue('b', 0)

    def set(self, training: bool) -> None:
        self._value.value = int(training)

    def is_set(self) -> bool:
        return bool(self._value.value)


class SignalTolerantWorkerInit:
    """``worker_init_fn`` that makes a worker ignore ``signals`` while
    ``flag`` is set, then calls the loader's own ``worker_init_fn``.

    Args:
        signals (Sequence[str]): Signal names, e.g. ``('SIGTERM',
            'SIGUSR1')``.
        flag (TrainingFlag): Set by the main process while it trains.
        worker_init_fn (callable, optional): The wrapped function.
    """

    def __init__(self,
                 signals: Sequence[str],
                 flag: TrainingFlag,
                 worker_init_fn: Optional[Callable[[int], None]] = None):
        self.signals = tuple(signals)
        self.flag = flag
        self.worker_init_fn = worker_init_fn

    def _handle(self, signum, frame) -> None:
        if self.flag.is_set():
            return  # the main process checkpoints, then stops the workers
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def __call__(self, worker_id: int) -> None:
        for name in self.signals:
            signal.signal(getattr(signal, name), self._handle)
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
