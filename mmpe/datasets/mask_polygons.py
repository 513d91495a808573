"""Binary mask -> COCO polygons that pycocotools rasterises back exactly.

Used by :func:`mmpe.datasets.generate_synthetic_coco` for the
``segmentation`` of every visible object mask.
"""
from typing import List

import cv2
import numpy as np

__all__ = ['mask_to_polygons']


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
