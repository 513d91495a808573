"""Each image's valid region of a padded batch as graph tensors: the
pixel mask (and, for RT-DETR, the valid ratios) built from an ``img_shapes``
``(B, 2)`` tensor with tensor ops, the twins of what the detectors build in
Python from their data samples."""
from typing import Tuple

import torch
from torch import Tensor


def padding_mask_from_img_shapes(img_shapes: Tensor,
                                 batch_shape: Tuple[int, int]) -> Tensor:
    """``(B, H, W)`` bool mask, True on padding, with tensor ops.

    The graph twin of :func:`mmpe.models.utils.padding_mask_from_shapes`:
    image ``i``'s valid region ``img_shapes[i] = (h_i, w_i)`` sits at the
    top-left of the ``(H, W)`` batch (mmdet pads bottom/right).

    Args:
        img_shapes (Tensor): ``(B, 2)`` integer valid sizes ``(h, w)``.
        batch_shape (tuple[int, int]): The padded ``(H, W)``; may be
            symbolic while tracing.
    """
    height, width = batch_shape
    rows = torch.arange(height, device=img_shapes.device)
    cols = torch.arange(width, device=img_shapes.device)
    return ((rows[None, :, None] >= img_shapes[:, 0, None, None])
            | (cols[None, None, :] >= img_shapes[:, 1, None, None]))


def valid_ratios_from_img_shapes(img_shapes: Tensor,
                                 batch_shape: Tuple[int, int]) -> Tensor:
    """``(B, 2)`` float32 ``(w / W, h / H)`` per image, with tensor ops
    (the graph twin of ``RTDETR._valid_ratios``)."""
    height, width = batch_shape
    shapes = img_shapes.to(torch.float32)
    return torch.stack([shapes[:, 1] / width, shapes[:, 0] / height], -1)
