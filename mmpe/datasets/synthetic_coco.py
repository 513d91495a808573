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
real detection task with scale, aspect, position and occlusion variation):

* **Categories** (ids 1..4): ``square`` (rectangle of aspect 0.8..1.25,
  rotated up to +-20 deg), ``disk`` (ellipse of axis ratio 0.85..1.15),
  ``triangle`` (jittered equilateral, any rotation) and ``ring`` (annulus,
  inner radius 45..60% of the outer). Each class has its own hue (red,
  blue, green, yellow; +-8 deg jitter, saturation 0.55..0.9, value
  0.65..1) and each object a gentle linear shading, so shape and colour
  both identify the class.
* **Background**: smooth and low-contrast: a linear gradient between two
  greyish colours of one random hue (saturation <= 0.25, value 0.2..0.6),
  so objects stand out; the whole image gets a slight blur and mild
  Gaussian noise (sigma 3 of 255).
* **Image size**: the long side is uniform in ``[min_size, max_size]``
  (128..256 by default) and the aspect ratio ``w / h`` log-uniform in
  ``aspect_range`` (1:3..3:1), so batches are padded and feature grids
  differ.
* **Objects**: 1..``max_objects`` (3) per image (uniform), class uniform,
  extent (side / diameter) uniform in ``object_scale_range`` (30..70%) of
  the image's short side but at least ``min_object_size`` (24) px; the centre
  keeps at least ~70% of the extent inside the image, so some objects are
  truncated by the border. Objects are painted in order, later ones over
  earlier ones (occlusion). A placement is rejected (and re-sampled, up to
  30 tries, else the object is skipped) if it would leave any object with
  less than ``min_visible_frac`` (30%) of its full area visible, fewer than
  ``min_visible_area`` pixels, or a visible fragment smaller than
  ``min_fragment_area`` pixels. So every painted object is annotated, none
  is a sliver, and no unannotated remnant of a dropped object is left.
* **Annotations**: per object the *visible* mask (its mask minus later
  occluders, clipped to the image). ``segmentation`` holds polygons traced
  by :func:`mask_to_polygons`, which pycocotools rasterises back to exactly
  that mask (holes, e.g. of a ring, are kept by keyhole bridges); ``area``
  is its pixel count, ``bbox`` its tight box ``[x, y, w, h]`` in COCO's
  pixel-edge convention (always inside the image); ``iscrowd`` is 0.
* **Determinism**: image ``i`` of split ``s`` draws from its own
  ``numpy.random.Generator`` seeded by ``(seed, crc32(s), i)``, so the
  output does not depend on generation order and two runs give
  byte-identical files.

Example:
    >>> from mmpe.datasets import generate_synthetic_coco
    >>> generate_synthetic_coco('data/synthetic_coco')  # doctest: +SKIP
"""
import colorsys
import json
import os
import os.path as osp
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

import cv2
import numpy as np

__all__ = [
    'SYNTHETIC_COCO_CLASSES', 'SYNTHETIC_COCO_PALETTE',
    'SYNTHETIC_COCO_METAINFO', 'SyntheticCocoSummary',
    'generate_synthetic_coco', 'mask_to_polygons', 'render_synthetic_image'
]

# Bump when the drawing changes, so an existing set is never silently reused.
GENERATOR_VERSION = 1

SYNTHETIC_COCO_CLASSES: Tuple[str,
                              ...] = ('square', 'disk', 'triangle', 'ring')
# Class hues in degrees (red, blue, green, yellow); the RGB palette matches.
_CLASS_HUES: Tuple[float, ...] = (0.0, 220.0, 120.0, 50.0)
SYNTHETIC_COCO_PALETTE: List[Tuple[int, int, int]] = [(220, 20, 60),
                                                      (0, 128, 255),
                                                      (0, 200, 80),
                                                      (255, 200, 0)]
SYNTHETIC_COCO_METAINFO: Dict[str, object] = dict(
    classes=SYNTHETIC_COCO_CLASSES, palette=SYNTHETIC_COCO_PALETTE)

META_FILE = 'synthetic_coco_meta.json'
_IMG_NAME = re.compile(r'^\d{6}\.(jpg|png)$')
_IMG_FORMATS = ('jpg', 'png')
_MAX_TRIES = 30
_NOISE_STD = 3.0  # in 0..255 units: mild sensor-like noise


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


def mask_to_polygons(mask: np.ndarray) -> List[List[float]]:
    """Trace a binary mask into COCO polygons that rasterise back to it.

    pycocotools fills a pixel when its centre lies inside the polygon
    (even-odd rule; several polygons are merged by union). Contours are
    traced on the mask upsampled 2x, so vertices lie a quarter pixel inside
    the pixel edges: every boundary pixel centre is strictly inside, every
    outside centre strictly outside, even for one-pixel-wide parts. Holes
    (``cv2.RETR_CCOMP`` children) are spliced into their outer contour
    through a zero-width "keyhole" bridge walked in both directions, which
    the even-odd fill cancels.

    Args:
        mask (np.ndarray): Binary mask of shape (H, W), any dtype.

    Returns:
        list[list[float]]: One flattened ``[x1, y1, x2, y2, ...]`` polygon
        (>= 3 points) per connected component, in image pixel coordinates
        (pixel ``x`` spans ``[x, x + 1]``). Empty if the mask is empty.
    """
    ys, xs = np.nonzero(mask)
    if len(ys) == 0:
        return []
    x0, y0 = int(xs.min()), int(ys.min())
    crop = (mask[y0:ys.max() + 1, x0:xs.max() + 1] != 0).astype(np.uint8)
    crop = np.repeat(np.repeat(crop, 2, axis=0), 2, axis=1)  # (2h, 2w)
    # A zero border so contours along the crop edge are traced like any other.
    crop = cv2.copyMakeBorder(crop, 1, 1, 1, 1, cv2.BORDER_CONSTANT, value=0)
    contours, hierarchy = cv2.findContours(crop, cv2.RETR_CCOMP,
                                           cv2.CHAIN_APPROX_SIMPLE)
    if hierarchy is None:
        return []
    hierarchy = hierarchy[
        0]  # (num_contours, 4): next, prev, first_child, parent
    polygons = []
    for i, contour in enumerate(contours):
        if hierarchy[i][3] != -1:  # a hole: spliced into its parent below
            continue
        outer = contour[:, 0, :].astype(np.float64)  # (n, 2) as (x, y)
        child = hierarchy[i][2]
        while child != -1:
            hole = contours[child][:, 0, :].astype(np.float64)
            dist = ((outer[:, None, :] - hole[None, :, :])**2).sum(
                -1)  # (n, m)
            a, b = np.unravel_index(int(np.argmin(dist)), dist.shape)
            outer = np.concatenate(
                [outer[:a + 1], hole[b:], hole[:b + 1], outer[a:]])
            child = hierarchy[child][0]
        if len(outer) < 3:
            continue
        # Upsampled pixel centre (u + 0.5) / 2, minus the 1-pixel border.
        pts = (outer - 0.5) / 2.0 + np.array([x0, y0], dtype=np.float64)
        polygons.append([float(v) for v in pts.reshape(-1)])
    return polygons


def _hsv_to_bgr(hue_deg: float, sat: float, val: float) -> np.ndarray:
    """Colour as a float BGR vector in 0..255."""
    r, g, b = colorsys.hsv_to_rgb((hue_deg % 360.0) / 360.0, sat, val)
    return np.array([b, g, r], dtype=np.float32) * 255.0


def _shape_patch(label: int, size: float, center: Tuple[float, float],
                 patch_hw: Tuple[int,
                                 int], rng: np.random.Generator) -> np.ndarray:
    """Draw one shape as a binary mask of a local patch.

    Args:
        label (int): Class index in ``SYNTHETIC_COCO_CLASSES`` (0-based).
        size (float): Bounding extent in pixels (side / diameter).
        center (tuple[float, float]): Shape centre (x, y) in patch coordinates.
        patch_hw (tuple[int, int]): Patch (height, width).
        rng (np.random.Generator): Source of the shape's jitter.

    Returns:
        np.ndarray: uint8 mask of shape ``patch_hw`` (1 inside the shape).
    """
    shift = 4  # OpenCV fixed-point sub-pixel bits
    one = 1 << shift
    cx, cy = center
    patch = np.zeros(patch_hw, dtype=np.uint8)
    name = SYNTHETIC_COCO_CLASSES[label]
    if name == 'square':
        aspect = np.exp(rng.uniform(np.log(0.8), np.log(1.25)))
        half_w, half_h = size * np.sqrt(aspect) / 2, size / np.sqrt(aspect) / 2
        theta = np.deg2rad(rng.uniform(-20.0, 20.0))
        corners = np.array([[-half_w, -half_h], [half_w, -half_h],
                            [half_w, half_h], [-half_w, half_h]])
        rot = np.array([[np.cos(theta), -np.sin(theta)],
                        [np.sin(theta), np.cos(theta)]])
        pts = corners @ rot.T + np.array([cx, cy])
        cv2.fillPoly(patch, [np.round(pts * one).astype(np.int32)], 1,
                     cv2.LINE_8, shift)
    elif name == 'triangle':
        theta = rng.uniform(0.0, 2 * np.pi)
        angles = theta + np.arange(3) * 2 * np.pi / 3 + rng.uniform(
            -0.15, 0.15, 3)
        radii = 0.6 * size * rng.uniform(0.9, 1.1, 3)
        pts = np.stack(
            [cx + radii * np.cos(angles), cy + radii * np.sin(angles)], 1)
        cv2.fillPoly(patch, [np.round(pts * one).astype(np.int32)], 1,
                     cv2.LINE_8, shift)
    else:  # 'disk' or 'ring': an ellipse, the ring with an elliptic hole
        ratio = rng.uniform(0.85, 1.15)
        axes = (size / 2 * np.sqrt(ratio), size / 2 / np.sqrt(ratio))
        angle = rng.uniform(0.0, 180.0)
        c = (int(round(cx * one)), int(round(cy * one)))
        cv2.ellipse(patch, c,
                    (int(round(axes[0] * one)), int(round(axes[1] * one))),
                    angle, 0, 360, 1, -1, cv2.LINE_8, shift)
        if name == 'ring':
            inner = rng.uniform(0.45, 0.6)
            cv2.ellipse(patch, c, (int(round(
                axes[0] * inner * one)), int(round(axes[1] * inner * one))),
                        angle, 0, 360, 0, -1, cv2.LINE_8, shift)
    return patch


def _visible_ok(visible: np.ndarray, full_area: int, min_visible_frac: float,
                min_visible_area: int, min_fragment_area: int) -> bool:
    """Whether a visible mask is large enough and has no tiny fragments."""
    area = int(visible.sum())
    if area < min_visible_area or area < min_visible_frac * full_area:
        return False
    num, _, stats, _ = cv2.connectedComponentsWithStats(
        visible.view(np.uint8), connectivity=8)
    return bool((stats[1:, cv2.CC_STAT_AREA] >= min_fragment_area).all())


def render_synthetic_image(
    rng: np.random.Generator,
    min_size: int = 128,
    max_size: int = 256,
    aspect_range: Tuple[float, float] = (1 / 3, 3.0),
    max_objects: int = 3,
    object_scale_range: Tuple[float, float] = (0.3, 0.7),
    min_object_size: int = 24,
    min_visible_frac: float = 0.3,
    min_visible_area: int = 48,
    min_fragment_area: int = 16,
) -> Tuple[np.ndarray, List[Tuple[int, np.ndarray]]]:
    """Render one image and its objects' visible masks (see module doc).

    Args:
        rng (np.random.Generator): The image's own generator.
        min_size (int): Smallest long side in pixels. Defaults to 128.
        max_size (int): Largest long side in pixels. Defaults to 256.
        aspect_range (tuple[float, float]): Range of ``w / h``, sampled
            log-uniformly. Defaults to (1/3, 3).
        max_objects (int): Most objects per image (at least 1). Defaults to 3.
        object_scale_range (tuple[float, float]): Object extent as a
            fraction of the short side. Defaults to (0.3, 0.7).
        min_object_size (int): Smallest object extent in pixels.
            Defaults to 24.
        min_visible_frac (float): Smallest visible fraction of an object's full
            area. Defaults to 0.3.
        min_visible_area (int): Smallest visible area in pixels.
            Defaults to 48.
        min_fragment_area (int): Smallest connected piece of a visible mask in
            pixels. Defaults to 16.

    Returns:
        tuple: ``img`` uint8 BGR of shape (H, W, 3) and a list of
        ``(label, visible_mask)`` in painting order, ``label`` 0-based and
        ``visible_mask`` bool of shape (H, W).
    """
    long_side = int(rng.integers(min_size, max_size + 1))
    aspect = float(
        np.exp(rng.uniform(np.log(aspect_range[0]), np.log(aspect_range[1]))))
    if aspect >= 1:
        w, h = long_side, max(int(round(long_side / aspect)), 1)
    else:
        w, h = max(int(round(long_side * aspect)), 1), long_side
    short = min(h, w)

    # Smooth background: gradient between two close greyish colours.
    bg_hue = rng.uniform(0, 360)
    val0 = rng.uniform(0.2, 0.6)
    c0 = _hsv_to_bgr(bg_hue, rng.uniform(0, 0.25), val0)
    c1 = _hsv_to_bgr(bg_hue + rng.uniform(-20, 20), rng.uniform(0, 0.25),
                     float(np.clip(val0 + rng.uniform(-0.15, 0.15), 0, 1)))
    phi = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    proj = (xx * np.cos(phi) + yy * np.sin(phi))
    t = (proj - proj.min()) / max(float(np.ptp(proj)), 1.0)  # (H, W) in [0, 1]
    img = c0[None, None] * (1 - t[..., None]) + c1[None, None] * t[..., None]

    num_objects = int(rng.integers(1, max_objects + 1))
    full_areas: List[int] = []
    visibles: List[np.ndarray] = []
    labels: List[int] = []
    for _ in range(num_objects):
        label = int(rng.integers(len(SYNTHETIC_COCO_CLASSES)))
        lo = min(max(object_scale_range[0] * short, min_object_size), short)
        hi = max(object_scale_range[1] * short, lo)
        for _try in range(_MAX_TRIES):
            size = float(rng.uniform(lo, hi))
            # Centre may put up to ~20% of the extent outside the image.
            margin = min(0.3 * size, w / 2), min(0.3 * size, h / 2)
            cx = float(rng.uniform(margin[0], w - margin[0]))
            cy = float(rng.uniform(margin[1], h - margin[1]))
            radius = int(np.ceil(0.75 * size)) + 2
            ox, oy = int(np.floor(cx)) - radius, int(np.floor(cy)) - radius
            patch = _shape_patch(label, size, (cx - ox, cy - oy),
                                 (2 * radius + 1, 2 * radius + 1), rng)
            full_area = int(patch.sum())
            mask = np.zeros((h, w), dtype=bool)
            # Paste the patch, clipped to the image.
            px0, py0 = max(-ox, 0), max(-oy, 0)
            px1 = min(patch.shape[1], w - ox)
            py1 = min(patch.shape[0], h - oy)
            if px1 <= px0 or py1 <= py0 or full_area == 0:
                continue
            inside = patch[py0:py1, px0:px1] > 0
            mask[oy + py0:oy + py1, ox + px0:ox + px1] = inside
            ok = _visible_ok(mask, full_area, min_visible_frac,
                             min_visible_area, min_fragment_area)
            new_visibles = [v & ~mask for v in visibles]
            ok = ok and all(
                _visible_ok(v, a, min_visible_frac, min_visible_area,
                            min_fragment_area)
                for v, a in zip(new_visibles, full_areas))
            if not ok:
                continue
            # Paint: jittered class hue, gentle linear shading across it.
            colour = _hsv_to_bgr(_CLASS_HUES[label] + rng.uniform(-8, 8),
                                 rng.uniform(0.55, 0.9),
                                 rng.uniform(0.65, 1.0))
            psi = rng.uniform(0, 2 * np.pi)
            amp = rng.uniform(0, 0.15)
            along = ((xx[mask] - cx) * np.cos(psi) +
                     (yy[mask] - cy) * np.sin(psi))
            shade = 1 + amp * along / (size / 2)  # (num_pixels, )
            img[mask] = colour[None] * shade[:, None]
            visibles = new_visibles + [mask]
            full_areas.append(full_area)
            labels.append(label)
            break

    img = cv2.GaussianBlur(img, (3, 3), 0.6)
    img = img + rng.normal(0, _NOISE_STD, img.shape).astype(np.float32)
    img = np.clip(np.round(img), 0, 255).astype(np.uint8)
    return img, list(zip(labels, visibles))


def _split_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The generator of image ``index`` of ``split``, independent of others."""
    return np.random.default_rng(
        np.random.SeedSequence([seed, zlib.crc32(split.encode()), index]))


def _generate_split(out_dir: str, split: str, num_images: int, seed: int,
                    img_format: str, render_kwargs: dict) -> dict:
    """Write one split's images and return its COCO dict."""
    img_dir = osp.join(out_dir, split)
    os.makedirs(img_dir, exist_ok=True)
    images, annotations = [], []
    for index in range(num_images):
        img, objects = render_synthetic_image(
            _split_rng(seed, split, index), **render_kwargs)
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


def _check_args(num_train: int, num_val: int, min_size: int, max_size: int,
                aspect_range: Sequence[float], max_objects: int,
                object_scale_range: Sequence[float], img_format: str) -> None:
    """Raise ValueError naming the bad argument, its value, what is valid."""
    if num_train < 0 or num_val < 0:
        raise ValueError(
            f'`num_train`/`num_val` must be >= 0, got {num_train}, '
            f'{num_val}')
    if not 16 <= min_size <= max_size:
        raise ValueError(
            f'`min_size`/`max_size` must satisfy 16 <= min_size <= '
            f'max_size, got {min_size}, {max_size}')
    if not 0 < aspect_range[0] <= aspect_range[1]:
        raise ValueError(
            f'`aspect_range` must be (lo, hi) with 0 < lo <= hi, got '
            f'{tuple(aspect_range)}')
    if max_objects < 1:
        raise ValueError(f'`max_objects` must be >= 1, got {max_objects}')
    if not 0 < object_scale_range[0] <= object_scale_range[1] <= 1:
        raise ValueError(
            '`object_scale_range` must be (lo, hi) with 0 < lo <= hi '
            f'<= 1, got {tuple(object_scale_range)}')
    if img_format not in _IMG_FORMATS:
        raise ValueError(
            f'Unsupported `img_format` {img_format!r}, please choose '
            f'from {_IMG_FORMATS}')


def generate_synthetic_coco(
    out_dir: str = 'data/synthetic_coco',
    num_train: int = 800,
    num_val: int = 100,
    seed: int = 0,
    min_size: int = 128,
    max_size: int = 256,
    aspect_range: Tuple[float, float] = (1 / 3, 3.0),
    max_objects: int = 3,
    object_scale_range: Tuple[float, float] = (0.3, 0.7),
    min_object_size: int = 24,
    min_visible_frac: float = 0.3,
    img_format: str = 'jpg',
    overwrite: bool = False,
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
        min_size (int): Smallest image long side in pixels. Defaults to 128.
        max_size (int): Largest image long side in pixels. Defaults to 256.
        aspect_range (tuple[float, float]): Range of ``w / h`` (log-uniform).
            Defaults to (1/3, 3).
        max_objects (int): Most objects per image. Defaults to 3.
        object_scale_range (tuple[float, float]): Object extent as a
            fraction of the image's short side. Defaults to (0.3, 0.7).
        min_object_size (int): Smallest object extent in pixels.
            Defaults to 24.
        min_visible_frac (float): Objects are placed so that each keeps at
            least this fraction of its area visible. Defaults to 0.3.
        img_format (str): ``'jpg'`` (quality 95) or ``'png'``. Defaults to
            ``'jpg'``.
        overwrite (bool): Replace an existing set (its annotation files and
            ``NNNNNN.jpg``/``.png`` images in the split folders).
            Defaults to False.

    Returns:
        SyntheticCocoSummary: Paths and counts of what was written or found.
    """
    start = time.perf_counter()
    aspect_range = (float(aspect_range[0]), float(aspect_range[1]))
    object_scale_range = (float(object_scale_range[0]),
                          float(object_scale_range[1]))
    _check_args(num_train, num_val, min_size, max_size, aspect_range,
                max_objects, object_scale_range, img_format)
    render_kwargs = dict(
        min_size=int(min_size),
        max_size=int(max_size),
        aspect_range=aspect_range,
        max_objects=int(max_objects),
        object_scale_range=object_scale_range,
        min_object_size=int(min_object_size),
        min_visible_frac=float(min_visible_frac))
    params = dict(
        generator_version=GENERATOR_VERSION,
        num_train=int(num_train),
        num_val=int(num_val),
        seed=int(seed),
        img_format=img_format,
        **{
            k: list(v) if isinstance(v, tuple) else v
            for k, v in render_kwargs.items()
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
                               render_kwargs)
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
