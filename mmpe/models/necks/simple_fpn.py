"""Simple feature pyramid for plain (single-scale) ViT backbones.

Reference: Li et al., "Exploring Plain Vision Transformer Backbones for
Object Detection" (ViTDet), ECCV 2022, Sec. 3 / Fig. 2 (c): the pyramid is
built from the last stride-16 map alone, by deconvolutions (stride 4, 8),
identity (16) and pooling (32), each followed by a 1x1 and a 3x3 conv.
DINO on it (detrex's DINO-ViTDet) maps every level again by a 1x1 conv and
GroupNorm (DINO's channel mapper): ``out_norm_cfg``.
"""
from typing import List, Optional, Sequence, Tuple, Union

import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor

from ...utils.arg_checks import check_int


@MODELS.register_module()
class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of an NCHW map.

    Registered as a norm layer (``norm_cfg=dict(type='LayerNorm2d')``) for
    ViTDet's pyramid and heads, which normalise conv maps with LayerNorm.

    Args:
        num_channels (int): Channels C.
        eps (float): Epsilon. Defaults to 1e-6.
    """

    def __init__(self, num_channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(num_channels, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, C, H, W)."""
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@MODELS.register_module()
class ViTSimpleFPN(BaseModule):
    """ViTDet's simple feature pyramid, from one stride-s map to many.

    For each scale factor f (relative to the input map's stride s, so the
    level has stride s / f):

    - ``4.0``: deconv 2x2/2 -> LayerNorm2d -> GELU -> deconv 2x2/2
      (channels C -> C/2 -> C/4);
    - ``2.0``: deconv 2x2/2 (C -> C/2);
    - ``1.0``: identity;
    - ``0.5``: max-pool 2x2/2;

    then a 1x1 conv to ``out_channels`` and a 3x3 conv. Levels beyond the
    scale factors (``num_outs > len(scale_factors)``) are made from the last
    level: ``'maxpool'`` (1x1 max-pool with stride 2, as ViTDet/FPN's P6)
    or ``'conv'`` (3x3 stride-2 convs, ReLU between, as RetinaNet's P6/P7).

    With ``out_norm_cfg`` every output level (extra levels included) is
    mapped once more by a 1x1 conv with bias and that GroupNorm, under
    ``out_convs``: the channel mapper that detrex's DINO-ViTDet puts after
    the pyramid (its ``ChannelMapper`` of kernel 1 with
    ``GroupNorm(32, 256)``).

    The name avoids ``SimpleFPN``, which MMDetection 3.3.0's
    ``projects/ViTDet`` registers into the same registry.

    Args:
        in_channels (int | Sequence[int]): Channels of the backbone map (a
            one-element list, as FPN configs write it, is accepted).
        out_channels (int): Channels of every output level.
        scale_factors (Sequence[float]): Subset of (4.0, 2.0, 1.0, 0.5), in
            decreasing order. Defaults to (4.0, 2.0, 1.0, 0.5).
        num_outs (int, optional): Number of outputs; defaults to
            ``len(scale_factors)``.
        extra_type (str): 'maxpool' or 'conv' for the extra levels.
            Defaults to 'maxpool'.
        in_index (int): Which backbone output to use. Defaults to -1.
        norm_cfg (dict, optional): Norm of the 1x1 and 3x3 convs (e.g.
            ``dict(type='GN', num_groups=32)``); None for biased convs
            without norm. Defaults to None.
        out_norm_cfg (dict, optional): ``dict(type='GN', num_groups=...)``:
            a 1x1 conv and this GroupNorm on every output level (DINO's
            channel mapper); None (default): the levels as they are.
        init_cfg (dict | list[dict]): Initialisation config. Defaults to
            Xavier-uniform convs, as mmdet's FPN.
    """

    SCALE_FACTORS = (4.0, 2.0, 1.0, 0.5)
    EXTRA_TYPES = ('maxpool', 'conv')

    def __init__(self,
                 in_channels: Union[int, Sequence[int]],
                 out_channels: int,
                 scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5),
                 num_outs: Optional[int] = None,
                 extra_type: str = 'maxpool',
                 in_index: int = -1,
                 norm_cfg: Optional[dict] = None,
                 out_norm_cfg: Optional[dict] = None,
                 init_cfg: Union[dict, List[dict]] = dict(
                     type='Xavier', layer='Conv2d',
                     distribution='uniform')) -> None:
        super().__init__(init_cfg=init_cfg)
        if isinstance(in_channels, Sequence):
            if len(in_channels) != 1:
                raise ValueError(
                    f'ViTSimpleFPN: `in_channels` must be an int or a '
                    f'one-element list (it uses one backbone map), got '
                    f'{in_channels!r}')
            in_channels = in_channels[0]
        for name, value in (('in_channels', in_channels), ('out_channels',
                                                           out_channels)):
            check_int(name, value)
        scale_factors = tuple(float(f) for f in scale_factors)
        if (not scale_factors
                or any(f not in self.SCALE_FACTORS for f in scale_factors)
                or list(scale_factors) != sorted(set(scale_factors),
                                                 reverse=True)):
            raise ValueError(
                f'ViTSimpleFPN: `scale_factors` {scale_factors} must be a '
                f'non-empty, decreasing subset of {self.SCALE_FACTORS}')
        for factor, divisor in ((4.0, 4), (2.0, 2)):
            if factor in scale_factors and in_channels % divisor != 0:
                raise ValueError(
                    f'ViTSimpleFPN: scale factor {factor} needs `in_channels` '
                    f'divisible by {divisor}, got {in_channels}')
        num_outs = len(scale_factors) if num_outs is None else num_outs
        check_int('num_outs', num_outs, minimum=len(scale_factors),
                  hint='at least len(scale_factors)')
        if extra_type not in self.EXTRA_TYPES:
            raise ValueError(f'ViTSimpleFPN: unsupported `extra_type` '
                             f'{extra_type!r}, please choose from '
                             f'{self.EXTRA_TYPES}')
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.scale_factors = scale_factors
        self.num_outs = num_outs
        self.extra_type = extra_type
        self.in_index = in_index

        self.stages = nn.ModuleList()
        self.lateral_convs = nn.ModuleList()
        self.fpn_convs = nn.ModuleList()
        c = in_channels
        for factor in scale_factors:
            if factor == 4.0:
                stage = nn.Sequential(
                    nn.ConvTranspose2d(c, c // 2, 2, stride=2),
                    LayerNorm2d(c // 2), nn.GELU(),
                    nn.ConvTranspose2d(c // 2, c // 4, 2, stride=2))
                stage_channels = c // 4
            elif factor == 2.0:
                stage = nn.ConvTranspose2d(c, c // 2, 2, stride=2)
                stage_channels = c // 2
            elif factor == 1.0:
                stage = nn.Identity()
                stage_channels = c
            else:
                # ceil: the coarsest level still covers odd-sized maps
                stage = nn.MaxPool2d(2, stride=2, ceil_mode=True)
                stage_channels = c
            self.stages.append(stage)
            self.lateral_convs.append(
                ConvModule(
                    stage_channels,
                    out_channels,
                    1,
                    norm_cfg=norm_cfg,
                    act_cfg=None))
            self.fpn_convs.append(
                ConvModule(
                    out_channels,
                    out_channels,
                    3,
                    padding=1,
                    norm_cfg=norm_cfg,
                    act_cfg=None))
        self.extra_convs = nn.ModuleList()
        if extra_type == 'conv':
            for _ in range(num_outs - len(scale_factors)):
                self.extra_convs.append(
                    nn.Conv2d(
                        out_channels, out_channels, 3, stride=2, padding=1))
        self.out_convs = nn.ModuleList()
        if out_norm_cfg is not None:
            if not isinstance(out_norm_cfg, dict) or out_norm_cfg.get(
                    'type') not in ('GN', 'GroupNorm'):
                raise ValueError(
                    f'ViTSimpleFPN: unsupported `out_norm_cfg` '
                    f'{out_norm_cfg!r}, please give a GroupNorm config '
                    "(dict(type='GN', num_groups=32)) or None")
            for _ in range(num_outs):
                # a bias before the norm, as detrex's ChannelMapper
                self.out_convs.append(
                    ConvModule(
                        out_channels,
                        out_channels,
                        1,
                        bias=True,
                        norm_cfg=out_norm_cfg,
                        act_cfg=None))

    def forward(self, inputs: Sequence[Tensor]) -> Tuple[Tensor, ...]:
        """Build the pyramid from ``inputs[in_index]``.

        Args:
            inputs (Sequence[Tensor]): Backbone outputs; the used one is
                ``(B, in_channels, h, w)`` at stride s.

        Returns:
            tuple[Tensor]: ``num_outs`` maps ``(B, out_channels, h_i, w_i)``
            at strides ``s / f`` for each scale factor f, then ``2 s / f_min``,
            ``4 s / f_min``, ... for the extra levels (finest first); each
            through its ``out_convs`` entry where there are some.
        """
        x = inputs[self.in_index]
        outs = []
        for stage, lateral, fpn in zip(self.stages, self.lateral_convs,
                                       self.fpn_convs):
            outs.append(fpn(lateral(stage(x))))
        for i in range(self.num_outs - len(self.scale_factors)):
            if self.extra_type == 'maxpool':
                outs.append(F.max_pool2d(outs[-1], 1, stride=2))
            else:
                last = outs[-1] if i == 0 else F.relu(outs[-1])
                outs.append(self.extra_convs[i](last))
        if self.out_convs:
            outs = [conv(out) for conv, out in zip(self.out_convs, outs)]
        return tuple(outs)
