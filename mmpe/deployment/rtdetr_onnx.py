"""ONNX export of RT-DETR's tensor forward: padded images (and each image's
valid size) -> class logits and boxes of the decoder's output layer.

:class:`~mmpe.models.detectors.RTDETR` reads the padding from its data
samples in Python (the neck's pixel mask, each image's valid ratios and
valid cells). :class:`RTDETRExportWrapper` builds the same three from an
``img_shapes`` tensor with tensor ops, so one graph takes any batch, size
and padding; every other step is the detector's or its parts' own method
(backbone, ``neck(feats, padding_mask=...)``, ``bbox_head.flatten_levels``,
``pre_decoder`` / ``forward_decoder``). AIFI's position encoding (every
``encoder_pe`` choice) is built inside the neck for the graph's grid and
padding, so it needs nothing here.

Graph (all sizes but ``Q`` and ``C`` dynamic), as
:mod:`~mmpe.deployment.detr_onnx`'s::

    images      (B, 3, H, W)  float32, normalised and padded bottom/right
    img_shapes  (B, 2)        int64, each image's valid (h, w) at top-left
    -> scores   (B, Q, C)     the output layer's class logits (sigmoid
                              scores after ``.sigmoid()``; C = num_classes)
    -> boxes    (B, Q, 4)     normalised (cx, cy, w, h) of the valid image

The graph always carries the mask: an unpadded batch (``img_shapes`` the
whole input) gives an all-False mask and ratios of one, which compute what
the detector computes without a mask (to float rounding).
"""
from typing import Tuple

import torch
from torch import Tensor, nn

from ..models.detectors.rtdetr import RTDETR, valid_cells
from .img_shapes import (padding_mask_from_img_shapes,
                         valid_ratios_from_img_shapes)


class RTDETRExportWrapper(nn.Module):
    """RT-DETR's tensor forward with tensor inputs only.

    ``forward(images, img_shapes) -> (scores, boxes)`` of the decoder's
    output layer (``eval_idx``); equal to the detector's
    ``forward(images, samples, mode='tensor')`` at that layer when the
    samples carry the same ``img_shape`` and ``batch_input_shape``.

    Args:
        detector (RTDETR): In eval mode (the denoising groups are a
            training input; the graph has none).
    """

    def __init__(self, detector: RTDETR) -> None:
        super().__init__()
        if not isinstance(detector, RTDETR):
            raise ValueError(
                f'RTDETRExportWrapper: expected an RTDETR, got '
                f'{type(detector).__name__}')
        self.detector = detector

    def forward(self, images: Tensor,
                img_shapes: Tensor) -> Tuple[Tensor, Tensor]:
        """Output layer's ``(scores (B, Q, C), boxes (B, Q, 4))``.

        Args:
            images (Tensor): ``(B, 3, H, W)`` normalised, padded images.
            img_shapes (Tensor): ``(B, 2)`` int64 valid ``(h, w)`` of each.
        """
        detector = self.detector
        batch_shape = images.shape[-2:]
        pixel_mask = padding_mask_from_img_shapes(img_shapes, batch_shape)
        feats = detector.neck(detector.backbone(images),
                              padding_mask=pixel_mask)
        memory, shapes = detector.bbox_head.flatten_levels(feats)
        ratios = valid_ratios_from_img_shapes(img_shapes, batch_shape).to(
            memory.device)
        mask = valid_cells(ratios, shapes)
        dec_in, _ = detector.pre_decoder(memory, shapes, ratios, mask)
        out = detector.forward_decoder(
            **dec_in, spatial_shapes=shapes, memory_mask=mask,
            valid_ratios=ratios)
        all_scores, all_boxes = detector.bbox_head.forward(**out)
        return all_scores[-1], all_boxes[-1]
