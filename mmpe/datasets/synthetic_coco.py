"""Deterministic generator of a small COCO-format detection + instance set.

COCO and pretrained weights cannot be downloaded everywhere mmpe must run,
so the quick-start configs train on this embedded data set instead. It is
pure numpy + OpenCV and writes mmdet's ``CocoDataset`` layout::

    out_dir/                     # default data/synthetic_coco
        train/000000.jpg ...     # data_prefix=dict(img='train/')
        val/000000.jpg ...
        annotations/instances_train.json
        annotations/instances_val.json
        annotations/synthetic_coco_meta.json  # parameters; set is complete

Design (learnable by a tiny DETR trained from scratch for minutes, yet a
real detection task with scale, aspect, position and occlusion variation),
one concept per module:

* **Classes** (:mod:`.synthetic_shapes`): square, disk, triangle and ring,
  each with its own shape and hue.
* **Images** (:mod:`.synthetic_image`): long side 128..256 px, aspect
  1:3..3:1, smooth background, 1..3 objects of 30..70% of the short side
  placed with occlusion rules; :class:`SyntheticImageParams` holds these
  parameters and their defaults. ``canvas=c`` makes the images ``c`` times
  larger per side at the same object sizes in pixels and the same
  expected objects per unit area (a test set of longer sequences at the
  training object scale, beside a resized test set whose objects grow).
* **Annotations**: per object the *visible* mask (its mask minus later
  occluders, clipped to the image). ``segmentation`` holds polygons traced
  by :func:`mask_to_polygons`, which pycocotools rasterises back to exactly
  that mask (holes, e.g. of a ring, are kept by keyhole bridges); ``area``
  is its pixel count, ``bbox`` its tight box ``[x, y, w, h]`` in COCO's
  pixel-edge convention (always inside the image); ``iscrowd`` is 0.
* **Files** (this module): the splits, their COCO JSON, the meta file and
  the policy never to overwrite a set written otherwise.
* **Determinism**: image ``i`` of split ``s`` draws from its own
  ``numpy.random.Generator`` seeded by ``(seed, crc32(s), i)``, so the
  output does not depend on generation order and two runs give
  byte-identical files.

Example:
    >>> from mmpe.datasets import generate_synthetic_coco
    >>> generate_synthetic_coco('data/synthetic_coco')  # doctest: +SKIP
"""
import json
import os
import os.path as osp
import re
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Dict

import cv2
import numpy as np

from .mask_polygons import mask_to_polygons
from .synthetic_image import SyntheticImageParams, render_synthetic_image
from .synthetic_shapes import SYNTHETIC_COCO_CLASSES

__all__ = ['SyntheticCocoSummary', 'generate_synthetic_coco']

# Bump when the drawing (this module, synthetic_image.py, synthetic_shapes.py
# or mask_polygons.py) changes, so an existing set is never silently reused.
GENERATOR_VERSION = 1

META_FILE = 'synthetic_coco_meta.json'
_IMG_NAME = re.compile(r'^\d{6}\.(jpg|png)$')
_IMG_FORMATS = ('jpg', 'png')


@dataclass
class SyntheticCocoSummary:
    """What :func:`generate_synthetic_coco` wrote (or found already there).

    Attributes:
        out_dir (str): Data root.
        ann_files (dict): Split name -> annotation file path.
        img_dirs (dict): Split name -> image folder path.
        num_images (dict): Split name -> number of images.
        num_instances (dict): Split name -> number of annotated objects.
        skipped (bool): True when an identical set already existed and
            nothing was written.
        seconds (float): Wall time of the call.
        params (dict): The generation parameters (as stored in the meta file).
    """
    out_dir: str
    ann_files: Dict[str, str] = field(default_factory=dict)
    img_dirs: Dict[str, str] = field(default_factory=dict)
    num_images: Dict[str, int] = field(default_factory=dict)
    num_instances: Dict[str, int] = field(default_factory=dict)
    skipped: bool = False
    seconds: float = 0.0
    params: Dict[str, object] = field(default_factory=dict)


def _split_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The generator of image ``index`` of ``split``, independent of others."""
    return np.random.default_rng(
        np.random.SeedSequence([seed, zlib.crc32(split.encode()), index]))


def _generate_split(out_dir: str, split: str, num_images: int, seed: int,
                    img_format: str, image: SyntheticImageParams) -> dict:
    """Write one split's images and return its COCO dict."""
    img_dir = osp.join(out_dir, split)
    os.makedirs(img_dir, exist_ok=True)
    images, annotations = [], []
    for index in range(num_images):
        img, objects = render_synthetic_image(
            _split_rng(seed, split, index), **asdict(image))
        h, w = img.shape[:2]
        file_name = f'{index:06d}.{img_format}'
        params = ([cv2.IMWRITE_JPEG_QUALITY, 95]
                  if img_format == 'jpg' else [cv2.IMWRITE_PNG_COMPRESSION, 3])
        if not cv2.imwrite(osp.join(img_dir, file_name), img, params):
            raise OSError(f'could not write {osp.join(img_dir, file_name)}')
        image_id = index + 1
        images.append(
            dict(id=image_id, file_name=file_name, width=w, height=h))
        for label, visible in objects:
            ys, xs = np.nonzero(visible)
            x0, y0 = int(xs.min()), int(ys.min())
            bbox = [
                float(x0),
                float(y0),
                float(xs.max() - x0 + 1),
                float(ys.max() - y0 + 1)
            ]
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=image_id,
                    category_id=label + 1,
                    segmentation=mask_to_polygons(visible),
                    area=float(len(ys)),
                    bbox=bbox,
                    iscrowd=0))
    return dict(
        info=dict(
            description=f'mmpe synthetic COCO-format shapes ({split})',
            version=str(GENERATOR_VERSION),
            year=2024,
            contributor='mmpe',
            url='',
            date_created=''),
        licenses=[dict(id=1, name='CC0 1.0 (generated data)', url='')],
        images=images,
        annotations=annotations,
        categories=[
            dict(id=i + 1, name=name, supercategory='shape')
            for i, name in enumerate(SYNTHETIC_COCO_CLASSES)
        ])


def generate_synthetic_coco(
    out_dir: str = 'data/synthetic_coco',
    num_train: int = 800,
    num_val: int = 100,
    seed: int = 0,
    *,
    img_format: str = 'jpg',
    overwrite: bool = False,
    **image_params,
) -> SyntheticCocoSummary:
    """Generate (or find) the synthetic COCO-format data set under ``out_dir``.

    Never overwrites data it did not write with the same parameters: if
    ``out_dir/annotations/instances_{train,val}.json`` or images of the
    target splits already exist, the call returns at once (``skipped=True``)
    when the meta file shows the same parameters, and otherwise raises
    ``FileExistsError`` unless ``overwrite=True``.

    Args:
        out_dir (str): Data root. Defaults to ``'data/synthetic_coco'``.
        num_train (int): Training images. Defaults to 800.
        num_val (int): Validation images. Defaults to 100.
        seed (int): Base seed. Defaults to 0.
        img_format (str): ``'jpg'`` (quality 95) or ``'png'``. Defaults to
            ``'jpg'``.
        overwrite (bool): Replace an existing set (its annotation files and
            ``NNNNNN.jpg``/``.png`` images in the split folders).
            Defaults to False.
        **image_params: Fields of :class:`SyntheticImageParams` (image
            size, objects, visibility); the others keep their defaults.

    Returns:
        SyntheticCocoSummary: Paths and counts of what was written or found.
    """
    start = time.perf_counter()
    image = SyntheticImageParams(**image_params)
    if num_train < 0 or num_val < 0:
        raise ValueError(
            f'`num_train`/`num_val` must be >= 0, got {num_train}, '
            f'{num_val}')
    image = image.checked()
    if img_format not in _IMG_FORMATS:
        raise ValueError(
            f'Unsupported `img_format` {img_format!r}, please choose '
            f'from {_IMG_FORMATS}')
    params = dict(
        generator_version=GENERATOR_VERSION,
        num_train=int(num_train),
        num_val=int(num_val),
        seed=int(seed),
        img_format=img_format,
        **{
            k: list(v) if isinstance(v, tuple) else v
            for k, v in asdict(image).items()
            # recorded only when not the default, so that sets written
            # before the field existed are still recognised as the same
            if not (k == 'object_hue' and v == 'class')
            and not (k == 'canvas' and v == 1)
        })
    splits = {'train': int(num_train), 'val': int(num_val)}
    ann_dir = osp.join(out_dir, 'annotations')
    ann_files = {s: osp.join(ann_dir, f'instances_{s}.json') for s in splits}
    img_dirs = {s: osp.join(out_dir, s) for s in splits}
    meta_file = osp.join(ann_dir, META_FILE)
    summary = SyntheticCocoSummary(
        out_dir=out_dir, ann_files=ann_files, img_dirs=img_dirs, params=params)

    existing = [p for p in ann_files.values() if osp.exists(p)]
    existing += [
        d for d in img_dirs.values()
        if osp.isdir(d) and any(_IMG_NAME.match(n) for n in os.listdir(d))
    ]
    if existing and not overwrite:
        old = None
        if osp.exists(meta_file):
            with open(meta_file) as f:
                old = json.load(f)
        if (old is not None and old.get('params') == params
                and all(osp.exists(p) for p in ann_files.values())):
            summary.skipped = True
            summary.num_images = old.get('num_images', {})
            summary.num_instances = old.get('num_instances', {})
            summary.seconds = time.perf_counter() - start
            return summary
        why = ('was generated with different parameters'
               if old is not None else 'was not written by this generator (or '
               'its generation did not finish)')
        raise FileExistsError(
            f'{existing[0]} already exists and {why}; refusing to '
            'overwrite it. Pass --overwrite (overwrite=True) to replace the '
            f'synthetic set in {out_dir!r}, or choose another --out-dir.')

    os.makedirs(ann_dir, exist_ok=True)
    if osp.exists(meta_file):
        os.remove(meta_file)  # only a finished run writes it back
    for split, img_dir in img_dirs.items():
        if overwrite and osp.isdir(img_dir):
            for name in os.listdir(img_dir):
                if _IMG_NAME.match(name):
                    os.remove(osp.join(img_dir, name))
    for split, num in splits.items():
        coco = _generate_split(out_dir, split, num, int(seed), img_format,
                               image)
        with open(ann_files[split], 'w') as f:
            json.dump(coco, f, separators=(',', ':'))
        summary.num_images[split] = len(coco['images'])
        summary.num_instances[split] = len(coco['annotations'])
    with open(meta_file, 'w') as f:
        json.dump(
            dict(
                params=params,
                num_images=summary.num_images,
                num_instances=summary.num_instances),
            f,
            indent=2)
    summary.seconds = time.perf_counter() - start
    return summary
