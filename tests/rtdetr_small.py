"""Small RT-DETRs for the tests (PResNetVd-18 of 8 base channels, mmpe's
``RTDETRHybridEncoder`` of 32 channels, a 2-layer decoder) and their data
samples."""
from typing import Optional, Tuple

import torch
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData
from torch import Tensor


def small_rtdetr_cfg(**head) -> dict:
    """A small R18-like RT-DETR (PResNetVd-18 with 8 base channels)."""
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
        backbone=dict(type='PResNetVd', depth=18, base_channels=8,
                      out_indices=(1, 2, 3), norm_eval=False,
                      zero_init_residual=False),
        neck=dict(type='RTDETRHybridEncoder', in_channels=[16, 32, 64],
                  hidden_dim=32, num_heads=2, dim_feedforward=64,
                  expansion=0.5),
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
