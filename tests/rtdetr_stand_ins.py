"""Small RT-DETR parts for the tests: a stand-in hybrid encoder (until
mmpe's ``RTDETRHybridEncoder`` is in), and builders of small RT-DETRs.

``StandInRTDETRNeck`` takes ``padding_mask`` as the real encoder does: a
1x1 conv + BN per level to ``hidden_dim``, then a 3x3 conv whose input is
zeroed on the padded cells of its level (so the mask changes the output,
and an image padded alone to the batch's shape gets what it gets in it).
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmengine.model import BaseModule
from mmengine.structures import InstanceData
from torch import Tensor, nn


@MODELS.register_module(force=True)
class StandInRTDETRNeck(BaseModule):
    """``(B, C_l, H_l, W_l)`` per level -> ``(B, hidden_dim, H_l, W_l)``."""

    def __init__(self, in_channels: Sequence[int], hidden_dim: int = 32,
                 init_cfg=None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.proj = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c, hidden_dim, 1), nn.BatchNorm2d(
                hidden_dim)) for c in in_channels)
        self.mix = nn.ModuleList(
            nn.Conv2d(hidden_dim, hidden_dim, 3, padding=1)
            for _ in in_channels)

    def forward(self, inputs: Sequence[Tensor],
                padding_mask: Optional[Tensor] = None) -> Tuple[Tensor, ...]:
        outs = []
        for x, proj, mix in zip(inputs, self.proj, self.mix):
            x = proj(x)
            if padding_mask is not None:
                # a cell is padding when all its pixels are (max-pool of
                # the valid pixels, as mmpe's token masks)
                valid = (~padding_mask).float()[:, None]
                valid = F.adaptive_max_pool2d(valid, x.shape[-2:])
                x = x * valid
            outs.append(x + mix(x))
        return tuple(outs)


def small_rtdetr_cfg(**head) -> dict:
    """A small R18-like RT-DETR (ResNetV1d-18 with 8 base channels)."""
    bbox_head = dict(
        type='RTDETRHead', num_classes=4, embed_dims=32, num_queries=20,
        in_channels=[32, 32, 32], num_levels=3, num_points=[2, 2, 2],
        num_heads=2, num_layers=2, ffn_dims=64, num_denoising=10)
    bbox_head.update(head)
    return dict(
        type='RTDETR',
        data_preprocessor=dict(
            type='DetDataPreprocessor', mean=[0, 0, 0],
            std=[255, 255, 255], bgr_to_rgb=True, pad_size_divisor=32),
        backbone=dict(type='ResNetV1d', depth=18, base_channels=8,
                      out_indices=(1, 2, 3), norm_eval=False,
                      zero_init_residual=False),
        neck=dict(type='StandInRTDETRNeck', in_channels=[16, 32, 64],
                  hidden_dim=32),
        bbox_head=bbox_head,
        test_cfg=dict(max_per_img=20))


def sample(img_shape: Tuple[int, int],
           batch_shape: Tuple[int, int],
           boxes: Optional[Tensor] = None,
           labels: Optional[Tensor] = None,
           scale_factor=(1.0, 1.0)) -> DetDataSample:
    """A data sample: ``img_shape`` inside ``batch_shape``, ground truth
    ``boxes`` (pixels, x1 y1 x2 y2) and ``labels``."""
    s = DetDataSample(metainfo=dict(
        img_shape=tuple(img_shape), ori_shape=tuple(img_shape),
        batch_input_shape=tuple(batch_shape), scale_factor=scale_factor,
        pad_shape=tuple(batch_shape)))
    if boxes is not None:
        s.gt_instances = InstanceData(bboxes=boxes, labels=labels)
    return s


def random_boxes(n: int, img_shape: Tuple[int, int],
                 gen: torch.Generator) -> Tensor:
    """``n`` boxes (x1 y1 x2 y2 pixels) inside an ``(h, w)`` image."""
    h, w = img_shape
    centre = 0.2 + 0.6 * torch.rand(n, 2, generator=gen)
    size = 0.1 + 0.3 * torch.rand(n, 2, generator=gen)
    xyxy = torch.cat([centre - size / 2, centre + size / 2], 1)
    return xyxy * torch.tensor([w, h, w, h], dtype=torch.float32)
