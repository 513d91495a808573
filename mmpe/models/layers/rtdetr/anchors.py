"""RT-DETR's query anchors: one box per cell of every level, and which of
them may seed a query.

Released code: ``rtdetrv2_pytorch/src/zoo/rtdetr/rtdetrv2_decoder.py``,
``RTDETRTransformerv2._generate_anchors``: cell ``(i, j)`` of level ``l``
(an ``h x w`` map) gets the box ``((j + 1/2) / w, (i + 1/2) / h,
g 2^l, g 2^l)`` (``g = 0.05``); a box with a coordinate outside
``(eps, 1 - eps)`` is invalid; valid boxes go to logits
``log(a / (1 - a))``, invalid ones to ``+inf``.

The released anchors are normalised to the whole (unpadded) input. In a
padded batch each image's boxes are normalised to its own valid extent:
with ``r = (r_x, r_y)`` the image's size over the padded input's, the
centres are ``((j + 1/2) / (w r_x), (i + 1/2) / (h r_y))``, so every cell
whose centre lies in the padding has a coordinate past ``1 - eps`` and is
invalid, and an image gets the same anchors alone (padded to the batch's
shape) as inside the batch. ``r = (1, 1)`` gives the released anchors.
"""
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor


def rtdetr_anchors(spatial_shapes: Sequence[Tuple[int, int]],
                   valid_ratios: Optional[Tensor] = None,
                   grid_size: float = 0.05,
                   eps: float = 1e-2,
                   dtype: torch.dtype = torch.float32,
                   device: Optional[torch.device] = None
                   ) -> Tuple[Tensor, Tensor]:
    """The anchors of a batch's levels as logits, and their valid mask.

    Args:
        spatial_shapes (sequence[tuple[int, int]]): ``(h_l, w_l)`` per level.
        valid_ratios (Tensor, optional): ``(B, 2)``: each image's
            ``(width, height)`` over the padded input's, in ``(0, 1]``.
            None: no padding.
        grid_size (float): ``g``, the level-0 box side. Defaults to 0.05.
        eps (float): Margin of the valid boxes. Defaults to 1e-2.
        dtype (torch.dtype): Of the anchors. Defaults to float32.
        device (torch.device, optional): Of the anchors.

    Returns:
        tuple[Tensor, Tensor]: anchors ``(B or 1, L, 4)`` (``(cx, cy, w,
        h)`` logits, ``+inf`` where invalid) and the valid mask
        ``(B or 1, L, 1)`` bool, ``L = sum(h_l * w_l)``.
    """
    boxes = []
    for level, (h, w) in enumerate(spatial_shapes):
        ys = torch.arange(h, dtype=dtype, device=device)
        xs = torch.arange(w, dtype=dtype, device=device)
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing='ij')
        # (h * w, 2) cell centres over the padded map (sizes as the tensor
        # gives them: symbolic while tracing)
        centres = torch.stack([(grid_x + 0.5) / w, (grid_y + 0.5) / h], -1)
        centres = centres.reshape(-1, 2)
        sides = torch.full_like(centres, grid_size * 2.0**level)
        boxes.append(torch.cat([centres, sides], -1))
    anchors = torch.cat(boxes, 0)[None]  # (1, L, 4)
    if valid_ratios is not None:
        # centres over each image's own extent; sides are already relative
        ratios = valid_ratios.to(device=device, dtype=dtype)
        anchors = torch.cat(
            [anchors[..., :2] / ratios[:, None], anchors[..., 2:].expand(
                ratios.shape[0], -1, -1)], -1)
    valid = ((anchors > eps) & (anchors < 1 - eps)).all(-1, keepdim=True)
    logits = torch.log(anchors / (1 - anchors))
    logits = torch.where(valid, logits, torch.full_like(logits, torch.inf))
    return logits, valid
