"""The four shape classes of the synthetic data set and how each is drawn.

Categories (ids 1..4): ``square`` (rectangle of aspect 0.8..1.25, rotated
up to +-20 deg), ``disk`` (ellipse of axis ratio 0.85..1.15), ``triangle``
(jittered equilateral, any rotation) and ``ring`` (annulus, inner radius
45..60% of the outer). Each class has its own hue (:data:`CLASS_HUES`: red,
blue, green, yellow), so shape and colour both identify the class.
"""
import colorsys
from typing import Dict, List, Tuple

import cv2
import numpy as np

__all__ = [
    'SYNTHETIC_COCO_CLASSES', 'SYNTHETIC_COCO_PALETTE',
    'SYNTHETIC_COCO_METAINFO', 'CLASS_HUES', 'hsv_to_bgr', 'shape_patch'
]

SYNTHETIC_COCO_CLASSES: Tuple[str,
                              ...] = ('square', 'disk', 'triangle', 'ring')
# Class hues in degrees (red, blue, green, yellow); the RGB palette matches.
CLASS_HUES: Tuple[float, ...] = (0.0, 220.0, 120.0, 50.0)
SYNTHETIC_COCO_PALETTE: List[Tuple[int, int, int]] = [(220, 20, 60),
                                                      (0, 128, 255),
                                                      (0, 200, 80),
                                                      (255, 200, 0)]
SYNTHETIC_COCO_METAINFO: Dict[str, object] = dict(
    classes=SYNTHETIC_COCO_CLASSES, palette=SYNTHETIC_COCO_PALETTE)


def hsv_to_bgr(hue_deg: float, sat: float, val: float) -> np.ndarray:
    """Colour as a float BGR vector in 0..255."""
    r, g, b = colorsys.hsv_to_rgb((hue_deg % 360.0) / 360.0, sat, val)
    return np.array([b, g, r], dtype=np.float32) * 255.0


def shape_patch(label: int, size: float, center: Tuple[float, float],
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
