"""Stop a run before its first step when its data is bad, naming every bad
file and annotation at once.

Without a check, a truncated JPEG or a label value beyond the classes ends a
run when a dataloader first reaches it, hours in, one file per crash (mmcv:
``AssertionError: failed to load image``; mmseg: a device-side assert in the
loss), and mmdet silently drops boxes outside their image, of zero size or
of an unknown category. :class:`DatasetCheckHook` runs
:func:`mmpe.datasets.data_check.check_dataset` on the train and val sets in
``before_train`` (after the runner built the loaders and loaded or resumed
the checkpoint, before any iteration) and on the test set in
``before_test``; ``configs/_base_/runtime_mmpe.py`` declares it, so it runs
under every launcher. On rank 0 it prints one summary line when all is well,
else every problem (the first ``max_listed`` in the log, all of them in
``<work_dir>/dataset_check_<split>.txt``) and the count of each kind; then
every rank raises :class:`DatasetCheckFailed`, which ends the process with
exit status 2 (:mod:`mmpe.engine.exit_status`).

With ``skip_bad_images=True`` the training images with a problem are left
out instead (a warning lists them) and training goes on: the train set keeps
the other samples (``BaseDataset.get_subset_``) and the train loop gets a
loader rebuilt from the config's ``train_dataloader`` around it (before any
worker reads a sample). Problems of the val or test set still stop the run
(their evaluator scores against its own annotation file, so dropping images
there would count their objects as missed), and so do problems of the whole
set (a class missing from the annotation file) and those of a wrapped train
set (``RepeatDataset`` and the like, whose indices are not the samples').

Settings in a config (the runtime base has the hook first in
``custom_hooks``)::

    custom_hooks = [dict(type='DatasetCheckHook', skip_bad_images=True), ...]
    # or, keeping the base's list:  --cfg-options custom_hooks.0.skip_bad_images=True
"""
import copy
import logging
import os.path as osp
from typing import List, Optional, Sequence

from mmengine.dist import broadcast_object_list, is_main_process
from mmengine.hooks import Hook
from mmengine.logging import print_log

from mmdet.registry import HOOKS
from mmpe.datasets.data_check import (DEFAULT_CACHE, CheckOptions,
                                      check_dataset, format_report)
from .exit_status import BadInput

#: Problems listed in the log (all of them go to the work dir's file).
MAX_LISTED = 50
DOC = 'docs/user_guides/dataset_check.md'


class DatasetCheckFailed(BadInput):
    """A checked data set has problems; exit status 2."""


@HOOKS.register_module()
class DatasetCheckHook(Hook):
    """Check the data sets a run reads before its first step.

    Args:
        skip_bad_images (bool): Leave the training images with a problem
            out (with a warning that lists them) instead of stopping.
            Defaults to False.
        cache_dir (str | None): Where per-file results are kept between
            runs; ``'default'``: ``$XDG_CACHE_HOME/mmpe/dataset_check`` (or
            ``~/.cache/...``); None keeps nothing. Defaults to ``'default'``.
        max_listed (int): Problems listed in the log. Defaults to 50.
        ignore_index (int): The label value segmentation losses ignore.
            Defaults to 255.
        splits (Sequence[str]): Which of ``'train'``, ``'val'`` (checked in
            ``before_train``) and ``'test'`` (``before_test``) to check.
            Defaults to all three.
    """

    SPLITS = ('train', 'val', 'test')
    priority = 'VERY_HIGH'

    def __init__(self,
                 skip_bad_images: bool = False,
                 cache_dir: Optional[str] = DEFAULT_CACHE,
                 max_listed: int = MAX_LISTED,
                 ignore_index: int = 255,
                 splits: Sequence[str] = SPLITS) -> None:
        if isinstance(splits, str):
            splits = (splits, )
        for split in splits:
            if split not in self.SPLITS:
                raise ValueError(f'Unsupported `splits` entry {split!r}, '
                                 f'please choose from {self.SPLITS}')
        if not isinstance(skip_bad_images, bool):
            raise ValueError(f'`skip_bad_images` must be True or False, got '
                             f'{skip_bad_images!r}')
        self.skip_bad_images = skip_bad_images
        self.cache_dir = cache_dir
        self.max_listed = max_listed
        self.ignore_index = ignore_index
        self.splits = tuple(splits)

    def before_train(self, runner) -> None:
        self._check(runner, [s for s in ('train', 'val') if s in self.splits])

    def before_test(self, runner) -> None:
        self._check(runner, ['test'] if 'test' in self.splits else [])

    @staticmethod
    def _loop(runner, split: str):
        """``runner.train_loop`` / ``val_loop`` / ``test_loop`` (None when
        the config has none)."""
        return getattr(runner, f'{split}_loop')

    def _check(self, runner, splits: List[str]) -> None:
        clean, stopped = [], []
        for split in splits:
            loop = self._loop(runner, split)
            if loop is None:
                continue
            loader = loop.dataloader
            options = CheckOptions(
                num_workers=getattr(loader, 'num_workers', 0) or 0,
                cache_dir=self.cache_dir, ignore_index=self.ignore_index)
            result = check_dataset(loader.dataset, f'{split} set', options)
            decision = [None, [], '']  # action, indices to drop, report
            if is_main_process():
                action = self._decide(split, loop, result)
                report = self._report(runner, split, result, action)
                if action == 'ok':
                    clean.append(report)
                decision = [action, result.bad_indices(), report]
            broadcast_object_list(decision)
            action, bad, report = decision
            if action == 'stop':
                stopped.append(report)
            elif action == 'skip':
                self._drop(runner, loop, loader, bad)
        if clean and is_main_process():
            print_log('dataset check: no problems in the ' + '; '.join(clean),
                      logger='current')
        if stopped:
            raise DatasetCheckFailed('\n'.join(stopped))

    def _decide(self, split: str, loop, result) -> str:
        if not result.problems:
            return 'ok'
        if (self.skip_bad_images and split == 'train' and not result.wrapped
                and not any(p.whole_set for p in result.problems)
                and self._why_no_skip(loop) is None):
            return 'skip'
        return 'stop'

    @staticmethod
    def _why_no_skip(loop) -> Optional[str]:
        if hasattr(loop, 'use_dataloader') or hasattr(
                loop, 'dataloader_iterator'):
            return None
        return (f'{type(loop).__name__} cannot change its loader; '
                'skip_bad_images needs ResumableEpochBasedTrainLoop (what '
                'MMPERunner uses for EpochBasedTrainLoop) or '
                'IterBasedTrainLoop')

    def _report(self, runner, split: str, result, action: str) -> str:
        """Log what the check found (not for a clean set: the caller puts
        those in one line); returns the text (the summary if clean)."""
        if action == 'ok':
            return result.summary() + ''.join(f'; note: {n}'
                                              for n in result.notes)
        problems = result.problems
        files = len({p.file for p in problems})
        listing = osp.join(runner.work_dir, f'dataset_check_{split}.txt')
        with open(listing, 'w') as f:
            f.write('\n'.join(p.line() for p in problems) + '\n')
        lines = format_report(problems, self.max_listed)
        if action == 'skip':
            bad = result.bad_files()
            head = (f'dataset check: {result.name} ({result.source}): '
                    f'skip_bad_images=True: leaving out {len(bad)} image(s) '
                    f'with {len(problems)} problem(s) and training on '
                    f'{result.num_samples - len(result.bad_indices())} of '
                    f'{result.num_samples} samples:')
            tail = [f'All problems: {listing}. {result.summary()}']
            level = logging.WARNING
        else:
            head = (f'dataset check: {result.name} ({result.source}): '
                    f'{len(problems)} problem(s) in {files} file(s); the run '
                    'stops before training (exit status 2):')
            tail = [f'All problems: {listing}. Fix or remove these files and '
                    'annotations (see ' + DOC + ').']
            if split == 'train' and not self.skip_bad_images:
                tail.append('To train without the bad training images '
                            'instead, set skip_bad_images=True on '
                            'DatasetCheckHook (e.g. --cfg-options '
                            'custom_hooks.0.skip_bad_images=True with the '
                            'runtime base).')
            elif split == 'train':
                why = self._why_no_skip(self._loop(runner, split)) or (
                    'the problems above concern the whole set or a wrapped '
                    'one')
                tail.append(f'skip_bad_images=True cannot help: {why}.')
            else:
                tail.append('skip_bad_images leaves out training images '
                            'only: an evaluator scores the '
                            f'{result.name} against its own annotation '
                            'file.')
            level = logging.WARNING  # ERROR adds the source path to each line
        for note in result.notes:
            tail.append(f'note: {note}')
        text = '\n'.join([head, *lines, *tail])
        print_log(text, logger='current', level=level)
        return text

    @staticmethod
    def _drop(runner, loop, loader, bad: List[int]) -> None:
        """Train on the samples not in ``bad``: the data set shrinks in
        place and the loop gets a loader built as the config builds it."""
        dataset = loader.dataset
        drop = set(bad)
        dataset.get_subset_([i for i in range(len(dataset)) if i not in drop])
        cfg = copy.deepcopy(runner.cfg.get('train_dataloader'))
        cfg['dataset'] = dataset
        randomness = runner.cfg.get('randomness') or {}
        new = runner.build_dataloader(
            cfg, seed=runner.seed,
            diff_rank_seed=randomness.get('diff_rank_seed', False))
        if hasattr(loop, 'use_dataloader'):
            loop.use_dataloader(new)
        else:  # IterBasedTrainLoop: its iterator was made in __init__
            loop.dataloader = new
            loop.dataloader_iterator = type(loop.dataloader_iterator)(new)
