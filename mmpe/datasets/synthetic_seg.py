"""Semantic label maps for the synthetic data set (mmseg's layout).

:func:`generate_synthetic_seg` makes (or finds) the COCO-format set of
:func:`~mmpe.datasets.generate_synthetic_coco` -- unchanged, byte for byte --
and writes one label map per image beside it::

    out_dir/
        train/000000.jpg ...          # the COCO set's images
        seg_maps/train/000000.png ... # uint8 label maps, same size
        seg_maps/val/000000.png ...
        annotations/synthetic_seg_meta.json  # parameters; maps complete

Label values: 0 is the background, a real class (``reduce_zero_label=False``
in mmseg), and ``1 + k`` the k-th shape class of
:data:`~mmpe.datasets.SYNTHETIC_COCO_CLASSES` -- the COCO ``category_id``.
The maps are drawn from the same visible masks as the COCO annotations: each
image is rendered again from its own seed (rendering is deterministic), and
every object's visible mask (its mask minus later occluders, so the masks
are disjoint) is painted with its class. The COCO polygons rasterise back to
exactly those masks, so the label maps equal the maps painted from the COCO
annotations, pixel for pixel (tests/test_datasets/test_synthetic_seg.py).
"""
import json
import os
import os.path as osp
import time
from dataclasses import asdict
from typing import Dict, List, Tuple

import cv2
import numpy as np

from .synthetic_coco import (GENERATOR_VERSION, SyntheticCocoSummary,
                             _split_rng, generate_synthetic_coco)
from .synthetic_image import SyntheticImageParams, render_synthetic_image
from .synthetic_shapes import SYNTHETIC_COCO_CLASSES, SYNTHETIC_COCO_PALETTE

__all__ = [
    'SYNTHETIC_SEG_CLASSES', 'SYNTHETIC_SEG_PALETTE', 'SEG_MAP_DIR',
    'generate_synthetic_seg', 'render_label_map'
]

#: background (0) then the shape classes (their COCO category ids)
SYNTHETIC_SEG_CLASSES: Tuple[str, ...] = ('background',
                                          *SYNTHETIC_COCO_CLASSES)
SYNTHETIC_SEG_PALETTE: List[Tuple[int, int, int]] = [(40, 40, 40),
                                                     *SYNTHETIC_COCO_PALETTE]
SEG_MAP_DIR = 'seg_maps'
SEG_META_FILE = 'synthetic_seg_meta.json'
# Bump when the label maps' drawing (this module) changes.
SEG_MAP_VERSION = 1


def render_label_map(seed: int, split: str, index: int,
                     image: SyntheticImageParams) -> np.ndarray:
    """``(H, W)`` uint8 label map of image ``index`` of ``split``: 0 on the
    background, ``1 + label`` on each object's visible mask."""
    img, objects = render_synthetic_image(
        _split_rng(seed, split, index), **asdict(image))
    label_map = np.zeros(img.shape[:2], dtype=np.uint8)
    for label, visible in objects:
        label_map[visible] = label + 1
    return label_map


def _seg_params(coco: SyntheticCocoSummary) -> Dict[str, object]:
    return dict(seg_map_version=SEG_MAP_VERSION, coco=coco.params)


def generate_synthetic_seg(out_dir: str = 'data/synthetic_coco',
                           num_train: int = 800,
                           num_val: int = 100,
                           seed: int = 0,
                           *,
                           img_format: str = 'jpg',
                           overwrite: bool = False,
                           **image_params) -> SyntheticCocoSummary:
    """Generate (or find) the synthetic set and its semantic label maps.

    Arguments are those of :func:`generate_synthetic_coco` (which makes or
    finds the images and COCO annotations first, with the same refusal to
    overwrite a set written otherwise). The label maps are written unless
    the seg meta file shows the same parameters; ``overwrite`` replaces
    them.

    Returns:
        SyntheticCocoSummary: The COCO set's summary; ``skipped`` is True
        only when the images and the label maps both existed.
    """
    start = time.perf_counter()
    summary = generate_synthetic_coco(
        out_dir, num_train, num_val, seed, img_format=img_format,
        overwrite=overwrite, **image_params)
    params = _seg_params(summary)
    assert params['coco']['generator_version'] == GENERATOR_VERSION
    meta_file = osp.join(out_dir, 'annotations', SEG_META_FILE)
    if osp.exists(meta_file) and not overwrite:
        with open(meta_file) as f:
            if json.load(f).get('params') == params:
                summary.seconds = time.perf_counter() - start
                return summary
    if osp.exists(meta_file):
        os.remove(meta_file)  # only a finished run writes it back
    image = SyntheticImageParams(**image_params).checked()
    for split, num in (('train', num_train), ('val', num_val)):
        seg_dir = osp.join(out_dir, SEG_MAP_DIR, split)
        os.makedirs(seg_dir, exist_ok=True)
        for index in range(num):
            path = osp.join(seg_dir, f'{index:06d}.png')
            if not cv2.imwrite(path, render_label_map(seed, split, index,
                                                      image)):
                raise OSError(f'could not write {path}')
    with open(meta_file, 'w') as f:
        json.dump(dict(params=params, classes=list(SYNTHETIC_SEG_CLASSES)),
                  f, indent=2)
    summary.skipped = False
    summary.seconds = time.perf_counter() - start
    return summary
