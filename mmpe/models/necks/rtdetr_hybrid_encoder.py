"""RT-DETR's hybrid encoder, with any of mmpe's position encodings in AIFI.

Zhao et al., "DETRs Beat YOLOs on Real-time Object Detection" (RT-DETR,
CVPR 2024), Sec. 4.2 / Fig. 3, as released in ``rtdetrv2_pytorch``
(``src/zoo/rtdetr/hybrid_encoder.py``, ``HybridEncoder``, version ``'v2'``;
the v1 projections compute the same): a 1x1 conv + BN projects every
backbone level to ``hidden_dim``; AIFI, a post-norm transformer encoder
layer, runs on the chosen levels (the stride-32 map); CCFM fuses the levels
top-down (1x1 lateral conv, nearest 2x upsampling, :class:`CSPRepLayer`
on the concatenation) and bottom-up (3x3 stride-2 conv,
:class:`CSPRepLayer`).

AIFI here is mmdet's DETR encoder layer (post-norm: attention, add,
LayerNorm, FFN, add, LayerNorm; the released layer computes the same) with
:class:`~mmpe.models.layers.PEMultiheadAttention`, so every attention
backend of mmpe runs it, and its position encoding is ``encoder_pe``
(:func:`~mmpe.models.utils.encoder_pe.parse_aifi_pe`): ``absolute`` the
released 2D sin-cos (``'sine'``) or ``'none'``, ``relative`` any of iRPE,
RoPE-2D / RoPE-Mixed (integer or normalised coordinates), log-CPB, 2D
ALiBi, LookHere. Everything is built for the grid of the call (no table of
one size): the released code builds its sin-cos for ``eval_spatial_size``
in eval mode, which breaks at other sizes.

The released sin-cos puts ``[sin(a w), cos(a w), sin(b w), cos(b w)]``
(``w_i = T^(-i / (C / 4))``) on a token, with ``(a, b)`` the two indices of
a ``(w, h)`` meshgrid flattened in the token order of an ``(h, w)`` map: on
a square grid ``(a, b) = (y, x)``, on others a shuffle (the token at
``k = y w + x`` gets ``(k // h, k % h)``). ``sine_layout='grid'`` (the
default) gives every grid ``(a, b) = (y, x)``: the released encoding on
square inputs, where RT-DETR is trained, and the same geometry on others;
``'released'`` reproduces the shuffle (the released outputs at non-square
sizes).

Padding: with ``padding_mask`` (True on padded pixels of the network input,
mmdet's bottom/right padding), AIFI's padded tokens are masked as keys,
normalised RoPE coordinates use each image's valid extent, and the
``'released'`` layout is computed per image on its valid grid; an image
padded to a batch shape then gives inside a batch what it gives alone
(the convolutions see the padding either way, as in every mmdet neck).
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor

from ...utils.arg_checks import check_int
from ..layers.blocks.pe_encoders import PEDetrTransformerEncoder
from ..layers.common.arg_checks import check_choice
from ..layers.encodings.pos_embed_2d import build_sincos_pos_embed_2d
from ..layers.encodings.rope_coords import RoPECoords, valid_extent
from ..layers.encodings.rope_mixed import RoPEMixed
from ..layers.grid_bias.log_cpb import LogCPB
from ..layers.irpe.irpe import iRPE
from ..utils.encoder_pe import (attention_pe_cfg, parse_aifi_pe,
                                rope_coords_cfg)
from ..utils.padding_mask import token_padding_mask
from .csp_rep import CSPRepLayer, RepVGGBlock

#: the released activation names -> mmcv's
ACTIVATIONS = {
    'relu': 'ReLU',
    'silu': 'SiLU',
    'swish': 'SiLU',
    'gelu': 'GELU',
    'leaky_relu': 'LeakyReLU',
}
#: token order of the released sin-cos (module docstring)
SINE_LAYOUTS = ('grid', 'released')


def act_cfg_of(name: str, act: Union[str, Dict, None]) -> Optional[Dict]:
    """An activation as the released configs name it (``'silu'``) or an
    mmcv config dict -> mmcv's config (None: no activation)."""
    if act is None or isinstance(act, dict):
        return act
    if act not in ACTIVATIONS:
        raise ValueError(f'Unsupported `{name}` {act!r}, please choose from '
                         f'{tuple(ACTIVATIONS)} or give an mmcv config dict')
    return dict(type=ACTIVATIONS[act])


def aifi_sincos(hw_shape: Tuple[int, int],
                embed_dims: int,
                temperature: float = 10000.,
                layout: str = 'grid',
                extent: Optional[Tensor] = None,
                device: Optional[torch.device] = None) -> Tensor:
    """RT-DETR's 2D sin-cos of an ``(h, w)`` token grid (module docstring).

    Args:
        hw_shape (tuple[int, int]): The (padded) grid ``(h, w)``.
        embed_dims (int): Channels C, a multiple of 4.
        temperature (float): Frequency base. Defaults to 10000.
        layout (str): ``'grid'`` or ``'released'``.
        extent (Tensor, optional): ``(B, 2)`` each image's valid ``(rows,
            cols)``; the ``'released'`` layout is that of each image's
            valid grid. None: the whole grid.
        device (torch.device, optional): Output device.

    Returns:
        Tensor: ``(1, h * w, C)`` (``'grid'``, or no ``extent``) or
        ``(B, h * w, C)``, float32, tokens row-major.
    """
    h, w = hw_shape
    half = embed_dims // 2
    ys = torch.arange(h, device=device)[:, None]
    xs = torch.arange(w, device=device)[None, :]
    if layout == 'grid':
        a = ys.expand(h, w).reshape(1, -1)
        b = xs.expand(h, w).reshape(1, -1)
        size = h + w
    else:
        rows, cols = h, w
        if extent is not None:
            rows, cols = extent[:, 0, None], extent[:, 1, None, None]
        k = (ys * cols + xs).reshape(-1, h * w)  # (1 or B, L) token index
        a = torch.div(k, rows, rounding_mode='floor')
        b = k - a * rows
        size = h * w
    # the 1D sin-cos [sin(p w), cos(p w)] of positions 0..size-1: the x
    # half of mmpe's 2D table of a (1, size) grid
    table = build_sincos_pos_embed_2d((1, size), embed_dims, temperature,
                                      device)[:, :half]
    return torch.cat([table[a], table[b]], dim=-1)


@MODELS.register_module()
class RTDETRHybridEncoder(BaseModule):
    """RT-DETR's hybrid encoder (module docstring): input projections, AIFI
    on ``use_encoder_idx`` with ``encoder_pe``, CCFM.

    Parameter names follow the released module (``input_proj``,
    ``encoder``, ``lateral_convs``, ``fpn_blocks``, ``downsample_convs``,
    ``pan_blocks``) with mmcv's and mmdet's inside (``conv`` / ``bn``;
    AIFI's ``self_attn.attn``, ``ffn``, ``norms``); the key mapping of
    released checkpoints is
    :func:`mmpe.models.utils.rtdetr_encoder_keys.hybrid_encoder_key`.

    Args:
        in_channels (Sequence[int]): Channels of each backbone level.
        feat_strides (Sequence[int]): Stride of each level (the padding
            mask's pixels per token of AIFI's levels).
        hidden_dim (int): Channels of every output. Defaults to 256.
        use_encoder_idx (Sequence[int]): Levels AIFI runs on. Defaults to
            ``[2]``.
        num_encoder_layers (int): Transformer layers of each AIFI (0: none).
            Defaults to 1.
        num_heads (int): Attention heads. Defaults to 8.
        dim_feedforward (int): FFN width. Defaults to 1024.
        dropout (float): Dropout of attention and FFN. Defaults to 0.
        enc_act (str | dict): FFN activation. Defaults to ``'gelu'``.
        expansion (float): Hidden width of the CSP layers over
            ``hidden_dim``. Defaults to 1.
        depth_mult (float): RepVGG blocks per CSP layer over 3. Defaults
            to 1.
        act (str | dict): Activation of the CCFM convs. Defaults to
            ``'silu'``.
        encoder_pe (dict, optional): AIFI's position encoding
            (:func:`~mmpe.models.utils.encoder_pe.parse_aifi_pe`). Defaults
            to ``dict(absolute='sine')``, the released encoder.
        pe_temperature (float): Frequency base of the sin-cos. Defaults to
            10000.
        sine_layout (str): ``'grid'`` or ``'released'`` (module docstring).
            Defaults to ``'grid'``.
        attn_impl (str): AIFI's attention backend (see
            :class:`~mmpe.models.layers.PEAttention`). Defaults to
            ``'auto'``.
        norm_cfg (dict): Norm of every conv. Defaults to BN (the released
            configs turn every BN into SyncBN when training on many GPUs).
        init_cfg (dict, optional): Initialisation config; None: PyTorch's
            default initialisation of every layer, as the released module.
    """

    def __init__(self,
                 in_channels: Sequence[int] = (512, 1024, 2048),
                 feat_strides: Sequence[int] = (8, 16, 32),
                 hidden_dim: int = 256,
                 use_encoder_idx: Sequence[int] = (2, ),
                 num_encoder_layers: int = 1,
                 num_heads: int = 8,
                 dim_feedforward: int = 1024,
                 dropout: float = 0.0,
                 enc_act: Union[str, Dict] = 'gelu',
                 expansion: float = 1.0,
                 depth_mult: float = 1.0,
                 act: Union[str, Dict] = 'silu',
                 encoder_pe: Optional[Dict] = None,
                 pe_temperature: float = 10000.,
                 sine_layout: str = 'grid',
                 attn_impl: str = 'auto',
                 norm_cfg: Dict = dict(type='BN'),
                 init_cfg: Optional[Dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self._check_args(in_channels, feat_strides, hidden_dim,
                         use_encoder_idx, num_encoder_layers, num_heads)
        check_choice('sine_layout', sine_layout, SINE_LAYOUTS)
        self.abs_pe, relative = parse_aifi_pe(encoder_pe)
        if self.abs_pe == 'sine' and hidden_dim % 4:
            raise ValueError(
                f"`encoder_pe.absolute` 'sine' needs `hidden_dim` to be a "
                f'multiple of 4, got {hidden_dim}')
        self.in_channels = list(in_channels)
        self.feat_strides = list(feat_strides)
        self.hidden_dim = hidden_dim
        self.use_encoder_idx = list(use_encoder_idx)
        self.num_encoder_layers = num_encoder_layers
        self.pe_temperature = float(pe_temperature)
        self.sine_layout = sine_layout
        self.out_channels = [hidden_dim] * len(in_channels)
        act_cfg = act_cfg_of('act', act)

        self.input_proj = nn.ModuleList([
            ConvModule(c, hidden_dim, 1, norm_cfg=norm_cfg, act_cfg=None)
            for c in in_channels
        ])
        attn_cfg = dict(
            embed_dims=hidden_dim,
            num_heads=num_heads,
            dropout=dropout,
            batch_first=True,
            attn_impl=attn_impl,
            **attention_pe_cfg(relative, hidden_dim, num_heads))
        layer_cfg = dict(
            self_attn_cfg=attn_cfg,
            ffn_cfg=dict(
                embed_dims=hidden_dim,
                feedforward_channels=dim_feedforward,
                num_fcs=2,
                ffn_drop=dropout,
                act_cfg=act_cfg_of('enc_act', enc_act)),
            norm_cfg=dict(type='LN'))
        self.encoder = nn.ModuleList([
            PEDetrTransformerEncoder(
                num_layers=num_encoder_layers, layer_cfg=layer_cfg)
            for _ in self.use_encoder_idx
        ] if num_encoder_layers > 0 else [])
        # the batch's RoPE positions, once for all layers (None: integer
        # indices, the rotary modules' own tables)
        coords = rope_coords_cfg(relative)
        self.rope_coords = None if coords is None else RoPECoords(
            **coords, prefix='encoder_pe.relative.')

        num_blocks = round(3 * depth_mult)
        csp = dict(num_blocks=num_blocks, expansion=expansion,
                   norm_cfg=norm_cfg, act_cfg=act_cfg)
        levels = len(in_channels)
        self.lateral_convs = nn.ModuleList([
            ConvModule(hidden_dim, hidden_dim, 1, norm_cfg=norm_cfg,
                       act_cfg=act_cfg) for _ in range(levels - 1)
        ])
        self.fpn_blocks = nn.ModuleList([
            CSPRepLayer(hidden_dim * 2, hidden_dim, **csp)
            for _ in range(levels - 1)
        ])
        self.downsample_convs = nn.ModuleList([
            ConvModule(hidden_dim, hidden_dim, 3, stride=2, padding=1,
                       norm_cfg=norm_cfg, act_cfg=act_cfg)
            for _ in range(levels - 1)
        ])
        self.pan_blocks = nn.ModuleList([
            CSPRepLayer(hidden_dim * 2, hidden_dim, **csp)
            for _ in range(levels - 1)
        ])

    @staticmethod
    def _check_args(in_channels, feat_strides, hidden_dim, use_encoder_idx,
                    num_encoder_layers, num_heads) -> None:
        for c in in_channels:
            check_int('in_channels[i]', c)
        for s in feat_strides:
            check_int('feat_strides[i]', s)
        if len(feat_strides) != len(in_channels) or not in_channels:
            raise ValueError(
                f'`feat_strides` {list(feat_strides)} and `in_channels` '
                f'{list(in_channels)} must name the same levels (at least '
                'one)')
        levels = tuple(range(len(in_channels)))
        for idx in use_encoder_idx:
            if idx not in levels:
                raise ValueError(f'Unsupported `use_encoder_idx` entry '
                                 f'{idx!r}, please choose from {levels}')
        check_int('hidden_dim', hidden_dim)
        check_int('num_encoder_layers', num_encoder_layers, minimum=0)
        check_int('num_heads', num_heads)
        if hidden_dim % num_heads:
            raise ValueError(f'`num_heads` {num_heads} must divide '
                             f'`hidden_dim` {hidden_dim}')

    def init_weights(self) -> None:
        """PyTorch's default initialisation of every conv, linear, norm and
        attention (the released module's), then each position encoding's
        own (iRPE tables, RoPE-Mixed frequencies, log-CPB MLPs); an
        ``init_cfg`` replaces the first part."""
        if self.init_cfg is not None:
            super().init_weights()
        else:
            for module in self.modules():
                if isinstance(module, (nn.Conv2d, nn.Linear, nn.LayerNorm,
                                       nn.modules.batchnorm._BatchNorm)):
                    module.reset_parameters()
                elif isinstance(module, nn.MultiheadAttention):
                    module._reset_parameters()  # Xavier, zero biases
        for module in self.modules():
            if isinstance(module, iRPE):
                module.reset_table()
            elif isinstance(module, (RoPEMixed, LogCPB)):
                module.reset_parameters()

    def forward(self,
                inputs: Sequence[Tensor],
                padding_mask: Optional[Tensor] = None) -> Tuple[Tensor, ...]:
        """Backbone levels -> fused levels.

        Args:
            inputs (Sequence[Tensor]): ``(B, C_l, H_l, W_l)`` per level, of
                strides ``feat_strides``.
            padding_mask (Tensor, optional): ``(B, H, W)`` bool, True on
                padded pixels of the network input (bottom/right padding).
                None: no padding.

        Returns:
            tuple[Tensor]: ``(B, hidden_dim, H_l, W_l)`` per level.
        """
        if len(inputs) != len(self.in_channels):
            raise ValueError(
                f'{len(inputs)} input levels for a neck built for '
                f'{len(self.in_channels)} (`in_channels` {self.in_channels})')
        feats = [proj(x) for proj, x in zip(self.input_proj, inputs)]
        for i, idx in enumerate(self.use_encoder_idx[:len(self.encoder)]):
            feats[idx] = self.aifi(i, feats[idx], padding_mask)

        # CCFM top-down: each level fused with the upsampled one above it
        levels = len(feats)
        inner = [feats[-1]]
        for j, idx in enumerate(range(levels - 1, 0, -1)):
            high = self.lateral_convs[j](inner[0])
            inner[0] = high
            low = feats[idx - 1]
            # nearest 2x (the released scale factor) to the lower level's
            # size, which is also right when a side is odd
            up = F.interpolate(high, size=low.shape[-2:], mode='nearest')
            inner.insert(0, self.fpn_blocks[j](torch.cat([up, low], 1)))
        # bottom-up: each level fused with the downsampled one below it
        outs = [inner[0]]
        for j in range(levels - 1):
            down = self.downsample_convs[j](outs[-1])
            outs.append(
                self.pan_blocks[j](torch.cat([down, inner[j + 1]], 1)))
        return tuple(outs)

    def aifi(self, index: int, feat: Tensor,
             padding_mask: Optional[Tensor] = None) -> Tensor:
        """AIFI ``index`` on one projected level ``(B, C, h, w)``."""
        batch, channels, height, width = feat.shape
        src = feat.flatten(2).transpose(1, 2)  # (B, h * w, C)
        key_padding_mask = None
        if padding_mask is not None:
            stride = self.feat_strides[self.use_encoder_idx[index]]
            key_padding_mask = token_padding_mask(
                padding_mask, stride, (height, width)).flatten(1)
        pos = None
        if self.abs_pe == 'sine':
            extent = None
            if key_padding_mask is not None and \
                    self.sine_layout == 'released':
                extent = valid_extent(key_padding_mask, (height, width))
            pos = aifi_sincos((height, width), channels,
                              self.pe_temperature, self.sine_layout, extent,
                              feat.device).to(src.dtype)
        rope_pos = None
        if self.rope_coords is not None:
            dtype = torch.float64 if src.dtype == torch.float64 else \
                torch.float32
            rope_pos = self.rope_coords((height, width), key_padding_mask,
                                        src.device, dtype)
        memory = self.encoder[index](
            query=src,
            query_pos=pos,
            key_padding_mask=key_padding_mask,
            spatial_shape=(height, width),
            rope_pos=rope_pos)
        return memory.transpose(1, 2).reshape(batch, channels, height, width)

    def switch_to_deploy(self) -> None:
        """Fuse every :class:`RepVGGBlock` into one conv, in place (the
        eval-mode outputs are unchanged)."""
        for module in self.modules():
            if isinstance(module, RepVGGBlock):
                module.switch_to_deploy()
