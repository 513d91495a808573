"""Check a semantic-segmentation label map: it exists, has one channel, the
size of its image, and only values that are classes or the ignore index.

A label map whose values exceed the classes ends, in mmseg, in a CUDA
device-side assert (or an ``IndexError`` on CPU) deep inside the loss, and a
label map of another size than its image in a shape error in the
augmentations; neither says which file is wrong.

:func:`read_label_map` reads a file once (PIL, as mmseg's
``LoadAnnotations``) and keeps its size and set of raw values, which is
what the cache stores; :func:`label_value_reason` applies mmseg's
``reduce_zero_label`` and ``label_map`` to those values. Valid values after
the mapping: ``0 .. num_classes - 1`` and ``ignore_index`` (255 in mmseg's
heads and ``IoUMetric``).
"""
import os.path as osp
from typing import Dict, List, Optional, Sequence

import numpy as np
from PIL import Image

#: What a cached label map result depends on besides the file.
LABEL_MAP_KEY = 'label_map:pil'


def load_label_map(seg_map_path: str, reduce_zero_label: bool = False,
                   label_map: Optional[Dict[int, int]] = None) -> np.ndarray:
    """``(H, W)`` label values as mmseg's ``LoadAnnotations`` yields them.

    Args:
        seg_map_path (str): PNG (or other PIL-readable) label file.
        reduce_zero_label (bool): 0 -> 255, v -> v - 1 (ADE20K's raw maps).
        label_map (dict, optional): Old value -> new value, applied after.

    Raises:
        ValueError: If the file has several channels (a colour image).
    """
    with Image.open(seg_map_path) as img:
        seg = np.array(img)
    if seg.ndim == 3:  # mmseg reads 'unchanged'; colour maps are not labels
        raise ValueError(
            f'label map {seg_map_path} has {seg.shape[2]} channels; a label '
            'map is a single-channel image of class indices')
    return np.array(
        map_values(seg.astype(np.int64), reduce_zero_label, label_map))


def map_values(values, reduce_zero_label: bool,
               label_map: Optional[Dict[int, int]]):
    """mmseg's ``reduce_zero_label`` then ``label_map``, on an int64 array
    (a whole map or its set of values)."""
    values = np.asarray(values, dtype=np.int64)
    if reduce_zero_label:
        values = values.copy()
        values[values == 0] = 255
        values = values - 1
        values[values == 254] = 255
    if label_map:
        mapped = values.copy()
        for old, new in label_map.items():
            mapped[values == old] = new
        values = mapped
    return values


def read_label_map(path: str) -> dict:
    """Read a label map once.

    Returns:
        dict: ``{'shape': [h, w], 'values': [...]}`` (the raw values), or
        ``{'kind': str, 'reason': str}``.
    """
    if not osp.isfile(path):
        return dict(kind='missing label map',
                    reason='the label map does not exist')
    try:
        with Image.open(path) as img:
            seg = np.array(img)
    except Exception as err:  # noqa: BLE001  (any failure: unreadable)
        return dict(kind='corrupt label map',
                    reason=f'the label map cannot be read ({err})')
    if seg.ndim == 3:
        return dict(
            kind='label map with channels',
            reason=f'the label map has {seg.shape[2]} channels; a label map '
            'is a single-channel image of class indices')
    return dict(shape=[int(seg.shape[0]), int(seg.shape[1])],
                values=np.unique(seg).astype(np.int64).tolist())


def label_value_reason(values: Sequence[int], num_classes: int,
                       ignore_index: int = 255,
                       reduce_zero_label: bool = False,
                       label_map: Optional[Dict[int, int]] = None
                       ) -> Optional[str]:
    """Why a label map's (raw) values do not fit the classes, or None."""
    mapped = np.unique(map_values(values, reduce_zero_label, label_map))
    bad = mapped[((mapped < 0) | (mapped >= num_classes))
                 & (mapped != ignore_index)]
    if not bad.size:
        return None
    how = ' after reduce_zero_label' if reduce_zero_label else ''
    return (f'has value(s) {bad.tolist()}{how}; valid: 0..{num_classes - 1} '
            f'({num_classes} classes) and the ignore index {ignore_index}')


def label_size_reason(label_shape: Sequence[int], img_path: str,
                      img_shape: Sequence[int]) -> Optional[str]:
    """Why a label map's size is not its image's, or None."""
    if list(label_shape) == list(img_shape):
        return None
    return (f'is {label_shape[1]} x {label_shape[0]} (w x h) but its image '
            f'{img_path} is {img_shape[1]} x {img_shape[0]}')


def label_problems(img_path: str, seg_map_path: str, num_classes: int,
                   ignore_index: int = 255, reduce_zero_label: bool = False,
                   label_map: Optional[Dict[int, int]] = None) -> List[str]:
    """What is wrong with one (image, label map) pair, one line each naming
    the label map; empty if nothing. The image's size is read from its
    header."""
    result = read_label_map(seg_map_path)
    if 'kind' in result:
        return [f'label map {seg_map_path} (of image {img_path}): '
                f'{result["reason"]}']
    lines = []
    if osp.isfile(img_path):
        with Image.open(img_path) as img:
            w, h = img.size  # header only
        reason = label_size_reason(result['shape'], img_path, [h, w])
        if reason:
            lines.append(f'label map {seg_map_path} {reason}')
    reason = label_value_reason(result['values'], num_classes, ignore_index,
                                reduce_zero_label, label_map)
    if reason:
        lines.append(f'label map {seg_map_path} {reason}')
    return lines
