"""Check a semantic-segmentation data set's label maps before training.

A label map whose values exceed the classes ends, in mmseg, in a CUDA
device-side assert (or an ``IndexError`` on CPU) deep inside the loss, and a
label map of another size than its image in a shape error in the
augmentations; neither says which file is wrong. :func:`check_seg_labels`
reads every label map of a data set (as mmseg's ``LoadAnnotations`` does:
PIL, ``reduce_zero_label`` and ``label_map`` applied) and raises one
:class:`SegLabelError` naming each bad file and what is wrong with it;
:class:`SegLabelCheckHook` runs it on the train and val sets in
``before_train``, i.e. before any training step.

Valid values after the mapping: ``0 .. num_classes - 1`` and
``ignore_index`` (255 in mmseg's heads and ``IoUMetric``).
"""
import os.path as osp
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
from mmengine.hooks import Hook
from PIL import Image

from mmseg.registry import HOOKS

#: problems listed in one error at most (the count of the rest is given)
MAX_REPORTED = 20


class SegLabelError(ValueError):
    """Label maps that do not fit their images or the classes."""


def load_label_map(seg_map_path: str, reduce_zero_label: bool = False,
                   label_map: Optional[Dict[int, int]] = None) -> np.ndarray:
    """``(H, W)`` label values as mmseg's ``LoadAnnotations`` yields them.

    Args:
        seg_map_path (str): PNG (or other PIL-readable) label file.
        reduce_zero_label (bool): 0 -> 255, v -> v - 1 (ADE20K's raw maps).
        label_map (dict, optional): Old value -> new value, applied after.
    """
    with Image.open(seg_map_path) as img:
        seg = np.array(img)
    if seg.ndim == 3:  # mmseg reads 'unchanged'; colour maps are not labels
        raise SegLabelError(
            f'label map {seg_map_path} has {seg.shape[2]} channels; a label '
            'map is a single-channel image of class indices')
    seg = seg.astype(np.int64)
    if reduce_zero_label:
        seg[seg == 0] = 255
        seg = seg - 1
        seg[seg == 254] = 255
    if label_map:
        mapped = seg.copy()
        for old, new in label_map.items():
            mapped[seg == old] = new
        seg = mapped
    return seg


def label_problems(img_path: str, seg_map_path: str, num_classes: int,
                   ignore_index: int = 255, reduce_zero_label: bool = False,
                   label_map: Optional[Dict[int, int]] = None) -> List[str]:
    """What is wrong with one (image, label map) pair; empty if nothing.

    Checks that the label file exists, that its size is the image's and
    that every value (after the mapping) is a class index or
    ``ignore_index``.
    """
    if not osp.isfile(seg_map_path):
        return [f'label map {seg_map_path} (of image {img_path}) does not '
                'exist']
    seg = load_label_map(seg_map_path, reduce_zero_label, label_map)
    problems = []
    if osp.isfile(img_path):
        with Image.open(img_path) as img:
            w, h = img.size  # header only
        if seg.shape[:2] != (h, w):
            problems.append(
                f'label map {seg_map_path} is {seg.shape[1]} x {seg.shape[0]}'
                f' (w x h) but its image {img_path} is {w} x {h}')
    values = np.unique(seg)
    bad = values[((values < 0) | (values >= num_classes))
                 & (values != ignore_index)]
    if bad.size:
        how = ' after reduce_zero_label' if reduce_zero_label else ''
        problems.append(
            f'label map {seg_map_path} has value(s) {bad.tolist()}{how}; '
            f'valid: 0..{num_classes - 1} ({num_classes} classes) and the '
            f'ignore index {ignore_index}')
    return problems


def check_seg_labels(data_list: Iterable[dict], num_classes: int,
                     ignore_index: int = 255, name: str = 'data set') -> None:
    """Raise :class:`SegLabelError` listing every bad sample of a data set.

    Args:
        data_list (Iterable[dict]): mmseg ``BaseSegDataset`` data infos
            (``img_path``, ``seg_map_path``, ``reduce_zero_label``,
            ``label_map``).
        num_classes (int): Number of classes.
        ignore_index (int): The value the loss and metric skip.
        name (str): How the data set is called in the message.
    """
    problems = []
    for info in data_list:
        if info.get('seg_map_path') is None:
            problems.append(f'image {info.get("img_path")} has no label '
                            'map path')
            continue
        problems += label_problems(
            info.get('img_path', ''), info['seg_map_path'], num_classes,
            ignore_index, bool(info.get('reduce_zero_label', False)),
            info.get('label_map'))
    if problems:
        more = len(problems) - MAX_REPORTED
        raise SegLabelError(
            f'{name}: {len(problems)} problem(s) in the label maps:\n  ' +
            '\n  '.join(problems[:MAX_REPORTED]) +
            (f'\n  ... and {more} more' if more > 0 else ''))


@HOOKS.register_module()
class SegLabelCheckHook(Hook):
    """Check the train and val label maps in ``before_train``.

    Reads every label map once (ADE20K's 22k files: about a minute on one
    core), so a bad file stops the run before its first step with a message
    naming the file and the value instead of an assert inside the loss.

    Args:
        ignore_index (int): The value the decode head and metric ignore.
            Defaults to 255.
        splits (Sequence[str]): Which of ``'train'``, ``'val'`` to check.
            Defaults to both.
    """

    SPLITS = ('train', 'val')
    priority = 'VERY_HIGH'

    def __init__(self, ignore_index: int = 255,
                 splits: Sequence[str] = ('train', 'val')) -> None:
        for split in splits:
            if split not in self.SPLITS:
                raise ValueError(f'Unsupported `splits` entry {split!r}, '
                                 f'please choose from {self.SPLITS}')
        self.ignore_index = ignore_index
        self.splits = tuple(splits)

    def before_train(self, runner) -> None:
        for split in self.splits:
            if split == 'val' and runner.val_loop is None:
                continue
            loader = (runner.train_dataloader
                      if split == 'train' else runner.val_loop.dataloader)
            dataset = _leaf_dataset(loader.dataset)
            classes = dataset.metainfo.get('classes')
            if not classes:
                raise ValueError(f'{split} data set {type(dataset).__name__}'
                                 ' names no classes (metainfo `classes`)')
            # get_data_info: data_list is emptied when serialize_data=True
            infos = (dataset.get_data_info(i) for i in range(len(dataset)))
            check_seg_labels(infos, len(classes), self.ignore_index,
                             f'{split} data set')


def _leaf_dataset(dataset):
    """Look through dataset wrappers (RepeatDataset, ...)."""
    while hasattr(dataset, 'dataset'):
        dataset = dataset.dataset
    return dataset
