"""Multi-scale deformable cross-attention, RT-DETRv2's version.

Zhu et al., "Deformable DETR" (ICLR 2021, Eq. 3), as RT-DETRv2 changes it
(Lv et al., "RT-DETRv2", 2024, Sec. 3; released code
``rtdetrv2_pytorch/src/zoo/rtdetr/rtdetrv2_decoder.py``, class
``MSDeformableAttention``, and ``utils.py``,
``deformable_attention_core_func_v2``): each head of query ``q`` samples
``P_l`` points on level ``l`` (a count per level) at

.. math::

    p = (c_x, c_y) + \\Delta p \\cdot \\frac{1}{P_l} \\cdot (w, h)
        \\cdot s_{\\mathrm{off}}

around its reference box ``(c_x, c_y, w, h)`` (``s_off = 0.5``), and sums
the sampled values weighted by one softmax over all the head's points of
all levels. Two ways to sample (``method``):

* ``'default'``: bilinear, zeros outside the map (``F.grid_sample``,
  ``align_corners=False``);
* ``'discrete'``: the nearest cell, ``floor(p * (w, h) + 0.5)`` clamped
  into the map, read by a gather (the released code's choice for
  deployment runtimes without ``grid_sample``). The released code clamps
  both axes by the map's height (``# FIX ME? for rectangle input``), which
  equals this on square maps; here each axis is clamped by its own size.

Plain PyTorch: it runs on CPU and exports to ONNX (``GridSample`` /
``GatherElements``).
"""
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ....utils.arg_checks import check_int
from ..common.arg_checks import check_choice

#: how the sampling points read the value maps
SAMPLING_METHODS = ('default', 'discrete')


def deformable_sample(value: Tensor,
                      spatial_shapes: Sequence[Tuple[int, int]],
                      locations: Tensor,
                      weights: Tensor,
                      num_points: Sequence[int],
                      method: str = 'default') -> Tensor:
    """Sample each level's value map at its points and sum with weights.

    Args:
        value (Tensor): ``(B, Lv, H, C)``, the levels' maps flattened
            row-major and concatenated (``Lv = sum(h_l * w_l)``).
        spatial_shapes (sequence[tuple[int, int]]): ``(h_l, w_l)`` per level.
        locations (Tensor): ``(B, Q, H, P, 2)`` points ``(x, y)`` in
            ``[0, 1]`` of each level's map (``P = sum(num_points)``, the
            points of level 0 first).
        weights (Tensor): ``(B, Q, H, P)`` attention weights.
        num_points (sequence[int]): ``P_l`` per level.
        method (str): ``'default'`` (bilinear) or ``'discrete'`` (nearest
            cell). Defaults to ``'default'``.

    Returns:
        Tensor: ``(B, Q, H * C)``.
    """
    B, _, H, C = value.shape
    Q = locations.shape[1]
    # (B, Lv, H, C) -> (B * H, C, Lv): one map per image and head
    value = value.permute(0, 2, 3, 1).flatten(0, 1)
    values = value.split([h * w for h, w in spatial_shapes], dim=-1)
    # (B, Q, H, P, 2) -> (B * H, Q, P, 2)
    locations = locations.permute(0, 2, 1, 3, 4).flatten(0, 1)
    level_locations = locations.split(list(num_points), dim=2)
    sampled = []
    for (h, w), value_l, loc_l, p in zip(spatial_shapes, values,
                                         level_locations, num_points):
        if method == 'default':
            value_l = value_l.reshape(B * H, C, h, w)
            # (B * H, C, Q, P_l)
            sampled.append(
                F.grid_sample(
                    value_l,
                    2 * loc_l - 1,
                    mode='bilinear',
                    padding_mode='zeros',
                    align_corners=False))
        else:
            # sizes as the tensor gives them (symbolic while tracing)
            x = torch.floor(loc_l[..., 0] * w + 0.5).clamp(0, w - 1).long()
            y = torch.floor(loc_l[..., 1] * h + 0.5).clamp(0, h - 1).long()
            index = (y * w + x).reshape(B * H, 1, Q * p).expand(-1, C, -1)
            sampled.append(
                torch.gather(value_l, 2, index).reshape(B * H, C, Q, p))
    # (B, Q, H, P) -> (B * H, 1, Q, P)
    weights = weights.permute(0, 2, 1, 3).reshape(B * H, 1, Q, -1)
    out = (torch.cat(sampled, dim=-1) * weights).sum(-1)
    # (B * H, C, Q) -> (B, Q, H * C)
    return out.reshape(B, H * C, Q).permute(0, 2, 1)


class MSDeformableAttentionV2(nn.Module):
    """RT-DETRv2's multi-scale deformable attention (see the module doc).

    Parameter names are the released code's (``sampling_offsets``,
    ``attention_weights``, ``value_proj``, ``output_proj``), and so is the
    initialisation (offsets on a circle of the heads, scaled by the point's
    index within its level; zero attention weights; Xavier projections).
    With ``method='discrete'`` the offsets are frozen (``requires_grad``
    False), as released: the nearest-cell read has no gradient to them.

    Args:
        embed_dims (int): Channels. Defaults to 256.
        num_heads (int): Heads. Defaults to 8.
        num_levels (int): Levels. Defaults to 3.
        num_points (int | list[int]): Points per head on each level (one
            count for all, or one per level). Defaults to 4.
        method (str): ``'default'`` or ``'discrete'``. Defaults to
            ``'default'``.
        offset_scale (float): ``s_off``. Defaults to 0.5.
    """

    def __init__(self,
                 embed_dims: int = 256,
                 num_heads: int = 8,
                 num_levels: int = 3,
                 num_points: Union[int, List[int]] = 4,
                 method: str = 'default',
                 offset_scale: float = 0.5) -> None:
        super().__init__()
        check_int('num_heads', num_heads, 1)
        check_int('num_levels', num_levels, 1)
        check_choice('cross_attn_method', method, SAMPLING_METHODS)
        if embed_dims % num_heads:
            raise ValueError(f'`embed_dims` {embed_dims} is not divisible by '
                             f'`num_heads` {num_heads}')
        if isinstance(num_points, int):
            num_points = [num_points] * num_levels
        num_points = list(num_points)
        if len(num_points) != num_levels or not all(
                isinstance(n, int) and n > 0 for n in num_points):
            raise ValueError(
                f'`num_points` {num_points} must be a positive int or one '
                f'positive int per level ({num_levels} levels)')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.num_levels = num_levels
        self.num_points = num_points
        self.method = method
        self.offset_scale = offset_scale
        total = sum(num_points)
        # 1 / P_l of each point's level (not in checkpoints: derived)
        self.register_buffer(
            'num_points_scale',
            torch.tensor([1 / n for n in num_points for _ in range(n)]),
            persistent=False)
        self.sampling_offsets = nn.Linear(embed_dims, num_heads * total * 2)
        self.attention_weights = nn.Linear(embed_dims, num_heads * total)
        self.value_proj = nn.Linear(embed_dims, embed_dims)
        self.output_proj = nn.Linear(embed_dims, embed_dims)
        self.init_weights()
        if method == 'discrete':
            self.sampling_offsets.requires_grad_(False)

    def init_weights(self) -> None:
        """The released initialisation (see the class doc)."""
        nn.init.zeros_(self.sampling_offsets.weight)
        angles = torch.arange(self.num_heads) * (2 * math.pi / self.num_heads)
        grid = torch.stack([angles.cos(), angles.sin()], -1)
        # the largest coordinate of each head's direction set to +-1
        grid = grid / grid.abs().max(-1, keepdim=True).values
        scale = torch.cat([torch.arange(1, n + 1) for n in self.num_points])
        bias = grid[:, None, :] * scale[None, :, None]
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(bias.flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for proj in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)

    def forward(self,
                query: Tensor,
                reference_boxes: Tensor,
                value: Tensor,
                spatial_shapes: Sequence[Tuple[int, int]],
                value_mask: Optional[Tensor] = None) -> Tensor:
        """Attend from the queries to the value maps.

        Args:
            query (Tensor): ``(B, Q, C)`` (with its position embedding).
            reference_boxes (Tensor): ``(B, Q, 1, 4)`` boxes ``(cx, cy, w,
                h)`` in ``[0, 1]`` of the (padded) maps.
            value (Tensor): ``(B, Lv, C)``, the flattened levels.
            spatial_shapes (sequence[tuple[int, int]]): ``(h_l, w_l)``.
            value_mask (Tensor, optional): ``(B, Lv)`` bool, True on valid
                cells; the others' values are zeroed. None: all valid.

        Returns:
            Tensor: ``(B, Q, C)``.
        """
        B, Q, _ = query.shape
        if reference_boxes.shape[-1] != 4:
            raise ValueError('`reference_boxes` must end in 4 (cx, cy, w, h)'
                             f', got shape {tuple(reference_boxes.shape)}')
        H, P = self.num_heads, int(self.num_points_scale.numel())
        value = self.value_proj(value)
        if value_mask is not None:
            value = value * value_mask.to(value.dtype).unsqueeze(-1)
        value = value.reshape(B, value.shape[1], H, -1)
        offsets = self.sampling_offsets(query).reshape(B, Q, H, P, 2)
        weights = self.attention_weights(query).reshape(B, Q, H, P)
        weights = weights.softmax(-1)
        scale = self.num_points_scale.to(query.dtype).unsqueeze(-1)
        # (B, Q, 1, 1, 2) boxes around which every head's points spread
        offsets = (offsets * scale * reference_boxes[:, :, None, :, 2:] *
                   self.offset_scale)
        locations = reference_boxes[:, :, None, :, :2] + offsets
        out = deformable_sample(value, spatial_shapes, locations, weights,
                                self.num_points, self.method)
        return self.output_proj(out)
