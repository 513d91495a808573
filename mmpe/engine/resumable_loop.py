"""Epoch-based training that resumes from a checkpoint saved mid-epoch.

``Runner.resume`` restores the loop's epoch ``e`` and iteration count ``i``
from the checkpoint's ``meta``. MMEngine's ``EpochBasedTrainLoop`` then
starts epoch ``e`` from its first batch, which is right for checkpoints
written at the end of an epoch (``i == e * len(dataloader)``) but repeats
batches, and overruns the epoch's iteration count, for one written in the
middle, such as the preemption checkpoint of
:class:`~mmpe.engine.PreemptionHook`.

:class:`ResumableEpochBasedTrainLoop` runs that first epoch from batch
``k = i - e * len(dataloader)``: it iterates the same batch sampler
(seeded by the epoch through ``DistSamplerSeedHook``, as in the
uninterrupted run) and drops the first ``k`` index batches *before* any data
is loaded, so no image is read and no augmentation draws random numbers for
the skipped batches. With the RNG states restored by
:class:`~mmpe.engine.RNGStateHook` and data loaded in the main process
(``num_workers=0``), the resumed run's iterations equal the uninterrupted
run's. (Dataloader workers draw their seeds when an epoch's iterator is
created, so with workers the augmentations of the resumed epoch differ.)
Every other epoch is ``EpochBasedTrainLoop.run_epoch`` unchanged.

:class:`~mmpe.engine.MMPERunner` uses it in place of ``train_cfg`` of type
``EpochBasedTrainLoop``; elsewhere::

    train_cfg = dict(type='ResumableEpochBasedTrainLoop', max_epochs=12)
"""
import itertools
import logging

import torch
from mmengine.logging import print_log
from mmengine.runner import EpochBasedTrainLoop
from torch.utils.data import DataLoader

from mmdet.registry import LOOPS


class SkipFirstBatches:
    """A batch sampler without the first ``skip`` batches of another.

    Args:
        batch_sampler (Iterable[list[int]]): Yields index batches.
        skip (int): How many of its first batches to drop.
    """

    def __init__(self, batch_sampler, skip: int):
        self.batch_sampler = batch_sampler
        self.skip = skip

    def __iter__(self):
        return itertools.islice(iter(self.batch_sampler), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip, 0)


def remainder_loader(dataloader: DataLoader, skip: int) -> DataLoader:
    """A one-epoch DataLoader over ``dataloader``'s batches from ``skip`` on.

    Same dataset, collate function, workers and seeding; its own batch
    sampler (:class:`SkipFirstBatches`) and no persistent workers.
    """
    kwargs = dict(
        num_workers=dataloader.num_workers,
        collate_fn=dataloader.collate_fn,
        pin_memory=dataloader.pin_memory,
        timeout=dataloader.timeout,
        worker_init_fn=dataloader.worker_init_fn,
        multiprocessing_context=dataloader.multiprocessing_context,
        generator=dataloader.generator,
        persistent_workers=False)
    if dataloader.num_workers > 0:
        kwargs['prefetch_factor'] = dataloader.prefetch_factor
    return DataLoader(
        dataloader.dataset,
        batch_sampler=SkipFirstBatches(dataloader.batch_sampler, skip),
        **kwargs)


@LOOPS.register_module()
class ResumableEpochBasedTrainLoop(EpochBasedTrainLoop):
    """``EpochBasedTrainLoop`` that continues a resumed epoch where its
    checkpoint was written; same arguments."""

    def use_dataloader(self, dataloader: DataLoader) -> None:
        """Train on ``dataloader`` from now on, before training starts (e.g.
        the train set without the images
        :class:`~mmpe.engine.DatasetCheckHook` left out): the iteration
        count follows its length."""
        self.dataloader = dataloader
        self._max_iters = self._max_epochs * len(dataloader)

    def run_epoch(self) -> None:
        done = self._iter - self._epoch * len(self.dataloader)
        if done <= 0:
            return super().run_epoch()
        if done > len(self.dataloader):
            raise ValueError(
                f'Unsupported resume point: iteration {self._iter} is past '
                f'the end of epoch {self._epoch + 1} '
                f'({len(self.dataloader)} iterations an epoch); was the '
                'checkpoint written with another batch size or data set?')
        print_log(
            f'Resuming epoch {self._epoch + 1} at batch {done + 1} of '
            f'{len(self.dataloader)} (the first {done} are skipped without '
            'loading them).',
            logger='current',
            level=logging.INFO)
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        # creating the iterator draws a worker base seed from torch's
        # global generator; the uninterrupted run drew it at the epoch's
        # start, before the state the checkpoint restored
        with torch.random.fork_rng(devices=[]):
            batches = iter(remainder_loader(self.dataloader, done))
        for idx, data_batch in enumerate(batches, start=done):
            self.run_iter(idx, data_batch)
        self.runner.call_hook('after_train_epoch')
        self._epoch += 1
