"""Reading the check's files: ``num_workers`` processes on each rank.

A torch ``DataLoader`` over the files (as the training loader would read
them; :data:`FILES_PER_BATCH` per round trip), and, in a distributed run,
every rank reading its share of what rank 0 decided to read (the files the
cache does not hold); the results are gathered on every rank. Rank 0 shows
a progress bar and its rate once there are :data:`PROGRESS_MIN_FILES` files
to read (a line at every tenth when the output is not a terminal).
"""
import sys
import time
from typing import List, Optional, Tuple

import torch
from mmengine.dist import (all_gather_object, broadcast_object_list,
                           get_dist_info)
from mmengine.logging import print_log
from torch.utils.data import DataLoader, Dataset

from .image_files import ImageReadSettings, check_image_file
from .label_maps import read_label_map

#: Show a progress bar from this many files to read on.
PROGRESS_MIN_FILES = 1000
#: Files one worker reads per batch (fewer round trips than one by one).
FILES_PER_BATCH = 16

#: What to read: a file and how (None: a label map).
Task = Tuple[str, Optional[ImageReadSettings]]


class _FileReads(Dataset):
    """One file read per item, for a DataLoader's workers."""

    def __init__(self, tasks: List[Task]):
        self.tasks = tasks

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, i: int) -> dict:
        path, settings = self.tasks[i]
        if settings is None:
            return read_label_map(path)
        return check_image_file(path, settings)


def _as_list(batch: list) -> list:
    return batch


class _Progress:
    """On a terminal mmengine's ``ProgressBar`` (count, rate, ETA); in a log
    file (a cluster job) one line at every tenth of the files instead of a
    line redrawn thousands of times."""

    def __init__(self, total: int):
        self.total, self.done = total, 0
        self.started = time.perf_counter()
        self.bar = None
        if sys.stdout.isatty():
            from mmengine.utils import ProgressBar
            self.bar = ProgressBar(total)

    def update(self, n: int) -> None:
        before, self.done = self.done, self.done + n
        if self.bar is not None:
            self.bar.update(n)
            if self.done == self.total:
                sys.stdout.write('\n')
            return
        if self.done * 10 // self.total > before * 10 // self.total:
            rate = self.done / max(time.perf_counter() - self.started, 1e-9)
            left = (self.total - self.done) / rate
            print_log(f'dataset check: {self.done}/{self.total} files read '
                      f'({rate:.0f} files/s, {left:.0f} s left)',
                      logger='current')


def _read(tasks: List[Task], num_workers: int, progress: bool) -> List[dict]:
    """Read ``tasks`` in order, ``num_workers`` processes."""
    if not tasks:
        return []
    # a generator of its own: a loader draws its workers' base seed from the
    # default one, and what the check reads depends on the cache, so the
    # training's random stream (and a resumed run's) would depend on it too
    loader = DataLoader(_FileReads(tasks), batch_size=FILES_PER_BATCH,
                        num_workers=min(num_workers, len(tasks)),
                        collate_fn=_as_list, generator=torch.Generator())
    shown = _Progress(len(tasks)) if progress and \
        len(tasks) >= PROGRESS_MIN_FILES else None
    results = []
    for batch in loader:
        results += batch
        if shown is not None:
            shown.update(len(batch))
    return results


def read_on_all_ranks(todo: list, num_workers: int, progress: bool
                      ) -> Tuple[list, list, float]:
    """Read rank 0's ``todo`` on every rank of the run, each its share.

    Every rank must call it.

    Args:
        todo (list): ``(key, task)`` pairs to read, from rank 0 (what other
            ranks pass is ignored); ``task`` is ``(path, settings)``.
        num_workers (int): Reading processes on each rank (0: the rank's
            own process).
        progress (bool): Show the progress on rank 0.

    Returns:
        tuple: ``todo`` as rank 0 gave it, the ``(key, result)`` pairs of
        every rank (each file's result of :func:`check_image_file` or
        :func:`read_label_map`) and the seconds this rank spent reading.
    """
    rank, world = get_dist_info()
    shared = [todo]
    broadcast_object_list(shared)
    todo = shared[0]
    mine = todo[rank::world]
    start = time.perf_counter()  # reported, never compared
    read = _read([task for _, task in mine], num_workers,
                 progress and rank == 0)
    seconds = time.perf_counter() - start
    gathered = all_gather_object(list(zip([key for key, _ in mine], read)))
    return todo, [pair for part in gathered for pair in part], seconds
