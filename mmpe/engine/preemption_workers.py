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

Each worker counts the signals it ignored in shared memory
(:meth:`SignalTolerantWorkerInit.ignored`), so that the main process, or a
test, can wait until every worker has taken a signal instead of guessing a
delay.
"""
import os
import signal
from multiprocessing.sharedctypes import RawArray, RawValue
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
        num_workers (int): Workers of the loader (ids ``0 .. num_workers -
            1``), each with its own counters of ignored signals. Defaults
            to 1.
    """

    def __init__(self,
                 signals: Sequence[str],
                 flag: TrainingFlag,
                 worker_init_fn: Optional[Callable[[int], None]] = None,
                 num_workers: int = 1):
        self.signals = tuple(signals)
        self.flag = flag
        self.worker_init_fn = worker_init_fn
        self.num_workers = num_workers
        # (num_workers, len(signals)) counters; each worker writes only its
        # own row, so plain shared memory needs no lock
        self._ignored = RawArray('l', num_workers * len(self.signals))
        self._worker_id: Optional[int] = None

    def _slot(self, worker_id: int, signum: int) -> int:
        names = [getattr(signal, n) for n in self.signals]
        return worker_id * len(self.signals) + names.index(signum)

    def ignored(self, worker_id: int, name: str) -> int:
        """How many ``name`` signals worker ``worker_id`` has ignored."""
        return self._ignored[self._slot(worker_id, getattr(signal, name))]

    def _handle(self, signum, frame) -> None:
        if self.flag.is_set():
            # the main process checkpoints, then stops the workers
            if self._worker_id is not None and \
                    0 <= self._worker_id < self.num_workers:
                self._ignored[self._slot(self._worker_id, signum)] += 1
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def __call__(self, worker_id: int) -> None:
        self._worker_id = worker_id
        for name in self.signals:
            signal.signal(getattr(signal, name), self._handle)
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
