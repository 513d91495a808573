"""One synthetic image: size, background, objects placed with occlusion rules.

* **Image size**: the long side is uniform in ``[min_size, max_size]``
  and the aspect ratio ``w / h`` log-uniform in ``aspect_range``, so
  batches are padded and feature grids differ.
* **Background**: smooth and low-contrast: a linear gradient between two
  greyish colours of one random hue (saturation <= 0.25, value 0.2..0.6),
  so objects stand out; the whole image gets a slight blur and mild
  Gaussian noise (sigma 3 of 255).
* **Objects**: 1..``max_objects`` per image (uniform), class uniform (drawn
  by :func:`~mmpe.datasets.synthetic_shapes.shape_patch`), extent (side /
  diameter) uniform in ``object_scale_range`` of the image's short side but
  at least ``min_object_size`` px; the centre keeps at least ~70% of the
  extent inside the image, so some objects are truncated by the border.
  Each is painted in its class hue (+-8 deg jitter, saturation 0.55..0.9,
  value 0.65..1) with a gentle linear shading; with ``object_hue='random'``
  the hue is uniform in 0..360 deg whatever the class, so only the shape
  tells the classes apart (the same masks and labels: one draw replaces
  the other). Objects are painted in
  order, later ones over earlier ones (occlusion). A placement is rejected
  (and re-sampled, up to 30 tries, else the object is skipped) if it would
  leave any object with less than ``min_visible_frac`` of its full area
  visible, fewer than ``min_visible_area`` pixels, or a visible fragment
  smaller than ``min_fragment_area`` pixels. So every painted object is
  annotated, none is a sliver, and no unannotated remnant of a dropped
  object is left.
* **Canvas** (``canvas = c > 1``, a test of longer sequences at the same
  object scale): the image size is drawn as above (the *base* size), then
  both sides are multiplied by ``c`` (rounded); object extents are drawn
  from the *base* short side exactly as at ``c = 1``, so objects have the
  same sizes in pixels on an image ``c`` times larger per side, and the
  number of objects is uniform in ``1..round(c^2 (max_objects + 1)) - 1``,
  i.e. ``c^2`` times as many on average: the same expected objects per
  unit area. ``c = 1`` draws exactly as before the option existed.
"""
from dataclasses import dataclass, replace
from typing import List, Tuple

import cv2
import numpy as np

from .synthetic_shapes import (CLASS_HUES, SYNTHETIC_COCO_CLASSES, hsv_to_bgr,
                               shape_patch)

__all__ = [
    'SyntheticImageParams', 'render_synthetic_image', 'canvas_max_objects'
]

_MAX_TRIES = 30
_NOISE_STD = 3.0  # in 0..255 units: mild sensor-like noise
OBJECT_HUES = ('class', 'random')


@dataclass(frozen=True)
class SyntheticImageParams:
    """The per-image parameters of the data set (all recorded in its meta file).

    Attributes:
        min_size (int): Smallest image long side in pixels. Defaults to 128.
        max_size (int): Largest image long side in pixels. Defaults to 256.
        aspect_range (tuple[float, float]): Range of ``w / h``, sampled
            log-uniformly. Defaults to (1/3, 3).
        max_objects (int): Most objects per image (at least 1). Defaults to 3.
        object_scale_range (tuple[float, float]): Object extent as a
            fraction of the image's short side. Defaults to (0.3, 0.7).
        min_object_size (int): Smallest object extent in pixels.
            Defaults to 24.
        min_visible_frac (float): Objects are placed so that each keeps at
            least this fraction of its full area visible. Defaults to 0.3.
        object_hue (str): ``'class'``: each class in its own hue (colour
            alone identifies it); ``'random'``: any hue for any class, so a
            model must recognise the shape, which takes the spatial layout
            of several patches (position information). Defaults to
            ``'class'``.
        canvas (float): Image sides times this factor (>= 1) at the same
            object sizes in pixels and the same expected objects per unit
            area (module docstring). Defaults to 1.
    """
    min_size: int = 128
    max_size: int = 256
    aspect_range: Tuple[float, float] = (1 / 3, 3.0)
    max_objects: int = 3
    object_scale_range: Tuple[float, float] = (0.3, 0.7)
    min_object_size: int = 24
    min_visible_frac: float = 0.3
    object_hue: str = 'class'
    canvas: float = 1.0

    def checked(self) -> 'SyntheticImageParams':
        """A copy with plain int / float values, after checking them.

        Raises:
            ValueError: Naming the bad field, its value and what is valid.
        """
        aspect_range = (float(self.aspect_range[0]),
                        float(self.aspect_range[1]))
        object_scale_range = (float(self.object_scale_range[0]),
                              float(self.object_scale_range[1]))
        if not 16 <= self.min_size <= self.max_size:
            raise ValueError(
                f'`min_size`/`max_size` must satisfy 16 <= min_size <= '
                f'max_size, got {self.min_size}, {self.max_size}')
        if not 0 < aspect_range[0] <= aspect_range[1]:
            raise ValueError(
                f'`aspect_range` must be (lo, hi) with 0 < lo <= hi, got '
                f'{aspect_range}')
        if self.max_objects < 1:
            raise ValueError(
                f'`max_objects` must be >= 1, got {self.max_objects}')
        if not 0 < object_scale_range[0] <= object_scale_range[1] <= 1:
            raise ValueError(
                '`object_scale_range` must be (lo, hi) with 0 < lo <= hi '
                f'<= 1, got {object_scale_range}')
        if self.object_hue not in OBJECT_HUES:
            raise ValueError(f'`object_hue` must be one of {OBJECT_HUES}, '
                             f'got {self.object_hue!r}')
        if isinstance(self.canvas, bool) or not isinstance(
                self.canvas, (int, float)) or not 1 <= self.canvas <= 16:
            raise ValueError(f'`canvas` must be a number in [1, 16] (1: the '
                             f'drawn size), got {self.canvas!r}')
        return replace(
            self,
            min_size=int(self.min_size),
            max_size=int(self.max_size),
            aspect_range=aspect_range,
            max_objects=int(self.max_objects),
            object_scale_range=object_scale_range,
            min_object_size=int(self.min_object_size),
            min_visible_frac=float(self.min_visible_frac),
            canvas=float(self.canvas))


def canvas_max_objects(max_objects: int, canvas: float) -> int:
    """Most objects on a canvas ``canvas`` times larger per side:
    ``round(canvas^2 (max_objects + 1)) - 1``, so that the mean of the
    uniform count ``1..N`` grows with the area (``max_objects`` at 1)."""
    return int(round(canvas**2 * (max_objects + 1))) - 1


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
    *,
    min_visible_area: int = 48,
    min_fragment_area: int = 16,
    **params,
) -> Tuple[np.ndarray, List[Tuple[int, np.ndarray]]]:
    """Render one image and its objects' visible masks (see module doc).

    Args:
        rng (np.random.Generator): The image's own generator.
        min_visible_area (int): Smallest visible area in pixels.
            Defaults to 48.
        min_fragment_area (int): Smallest connected piece of a visible mask in
            pixels. Defaults to 16.
        **params: Fields of :class:`SyntheticImageParams` (image size,
            objects, visibility); the others keep their defaults.

    Returns:
        tuple: ``img`` uint8 BGR of shape (H, W, 3) and a list of
        ``(label, visible_mask)`` in painting order, ``label`` 0-based and
        ``visible_mask`` bool of shape (H, W).
    """
    p = SyntheticImageParams(**params).checked()
    long_side = int(rng.integers(p.min_size, p.max_size + 1))
    aspect = float(
        np.exp(
            rng.uniform(np.log(p.aspect_range[0]), np.log(p.aspect_range[1]))))
    if aspect >= 1:
        w, h = long_side, max(int(round(long_side / aspect)), 1)
    else:
        w, h = max(int(round(long_side * aspect)), 1), long_side
    # object extents follow the base size; the canvas only adds room
    short = min(h, w)
    max_objects = canvas_max_objects(p.max_objects, p.canvas)
    if p.canvas != 1:
        h, w = int(round(h * p.canvas)), int(round(w * p.canvas))

    # Smooth background: gradient between two close greyish colours.
    bg_hue = rng.uniform(0, 360)
    val0 = rng.uniform(0.2, 0.6)
    c0 = hsv_to_bgr(bg_hue, rng.uniform(0, 0.25), val0)
    c1 = hsv_to_bgr(bg_hue + rng.uniform(-20, 20), rng.uniform(0, 0.25),
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
        lo = min(
            max(p.object_scale_range[0] * short, p.min_object_size), short)
        hi = max(p.object_scale_range[1] * short, lo)
        for _try in range(_MAX_TRIES):
            size = float(rng.uniform(lo, hi))
            # Centre may put up to ~20% of the extent outside the image.
            margin = min(0.3 * size, w / 2), min(0.3 * size, h / 2)
            cx = float(rng.uniform(margin[0], w - margin[0]))
            cy = float(rng.uniform(margin[1], h - margin[1]))
            radius = int(np.ceil(0.75 * size)) + 2
            ox, oy = int(np.floor(cx)) - radius, int(np.floor(cy)) - radius
            patch = shape_patch(label, size, (cx - ox, cy - oy),
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
            ok = _visible_ok(mask, full_area, p.min_visible_frac,
                             min_visible_area, min_fragment_area)
            new_visibles = [v & ~mask for v in visibles]
            ok = ok and all(
                _visible_ok(v, a, p.min_visible_frac, min_visible_area,
                            min_fragment_area)
                for v, a in zip(new_visibles, full_areas))
            if not ok:
                continue
            # Paint: jittered class hue (or any hue), gentle linear shading
            # across it. One draw either way, so masks do not change.
            if p.object_hue == 'class':
                hue = CLASS_HUES[label] + rng.uniform(-8, 8)
            else:
                hue = rng.uniform(0, 360)
            colour = hsv_to_bgr(hue, rng.uniform(0.55, 0.9),
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
