"""CPVT: a plain ViT with conditional position encodings, for detection.

Reference: Chu et al., "Conditional Positional Encodings for Vision
Transformers", ICLR 2023 (arXiv:2102.10882). The backbone is DeiT's plain
ViT (patch embedding, pre-norm blocks) with a PEG after block 0 (Sec. 3,
"position 0") and global-average pooling instead of a class token by
default; the position encoding is a single switch so that the paper's
comparison (none / learnable / sin-cos / PEG, plus 2D RoPE and iRPE) is one
config line.
"""
import math
import re
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks.drop import DropPath
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch import Tensor

from ..layers.peg import PEG
from ..layers.pos_embed_2d import SinCosPosEmbed2D, resample_pos_embed
from ..layers.rope2d import RoPE2D, apply_rope2d
from ..utils.padding_mask import padding_mask_from_shapes

RPE_ON_CHOICES = ('q', 'k', 'v', 'qk', 'kv', 'qv', 'qkv')


class Mlp(nn.Module):
    """Transformer feed-forward: fc1 -> GELU -> dropout -> fc2 -> dropout.

    Args:
        embed_dims (int): Input and output channels C.
        hidden_dims (int): Hidden channels.
        drop (float): Dropout after each linear layer. Defaults to 0.
    """

    def __init__(self,
                 embed_dims: int,
                 hidden_dims: int,
                 drop: float = 0.) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        """(B, N, C) -> (B, N, C)."""
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class CPVTAttention(nn.Module):
    """Multi-head self-attention with optional 2D RoPE, iRPE and key mask.

    Without iRPE on values the softmax runs in
    ``F.scaled_dot_product_attention``; iRPE terms on q/k enter it as an
    additive logit bias (iRPE Eq. 16, with q scaled before ``rpe_k`` and k
    before ``rpe_q`` as the authors). iRPE on values needs the attention
    probabilities, so that case computes the softmax explicitly (Eq. 17).

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads; must divide C.
        qkv_bias (bool): Bias in the qkv projection. Defaults to True.
        attn_drop (float): Dropout on attention probabilities.
            Defaults to 0.
        proj_drop (float): Dropout after the output projection.
            Defaults to 0.
        rpe_cfg (dict, optional): iRPE arguments (see :class:`CPVT`), with
            ``skip`` already set; None for no iRPE. Defaults to None.
        rpe_on (str): Where iRPE goes, one of :data:`RPE_ON_CHOICES`.
            Defaults to 'k'.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 qkv_bias: bool = True,
                 attn_drop: float = 0.,
                 proj_drop: float = 0.,
                 rpe_cfg: Optional[dict] = None,
                 rpe_on: str = 'k') -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dims // num_heads
        self.scale = self.head_dim**-0.5
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)
        self.rpe = nn.ModuleDict()
        if rpe_cfg is not None:
            from ..layers.irpe import iRPE  # noqa: only 'irpe' needs it
            for on in rpe_on:
                self.rpe[on] = iRPE(
                    head_dim=self.head_dim,
                    num_heads=num_heads,
                    on=on,
                    **rpe_cfg)

    def forward(self,
                x: Tensor,
                hw_shape: Tuple[int, int],
                num_skip: int = 0,
                rope: Optional[Tuple[Tensor, Tensor]] = None,
                key_padding_mask: Optional[Tensor] = None) -> Tensor:
        """Self-attention over ``num_skip + h * w`` tokens.

        Args:
            x (Tensor): ``(B, N, C)`` with ``N = num_skip + h * w``.
            hw_shape (tuple[int, int]): Token grid ``(h, w)``.
            num_skip (int): Leading skip tokens. Defaults to 0.
            rope (tuple[Tensor, Tensor], optional): ``(cos, sin)``, each
                ``(h * w, head_dim)``, from :class:`RoPE2D`.
            key_padding_mask (Tensor, optional): ``(B, N)`` bool, True on
                padded tokens, which are never attended to.

        Returns:
            Tensor: ``(B, N, C)``.
        """
        b, n, c = x.shape
        h, w = hw_shape
        # (B, N, 3C) -> (3, B, heads, N, head_dim)
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads,
                                  self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if rope is not None:
            q = apply_rope2d(q, *rope, num_skip=num_skip)
            k = apply_rope2d(k, *rope, num_skip=num_skip)

        bias = None  # additive logit term, (B or 1, heads, N, N)
        if 'k' in self.rpe:
            bias = self.rpe['k'](q * self.scale, h, w)
        if 'q' in self.rpe:
            term = self.rpe['q'](k * self.scale, h, w)
            bias = term if bias is None else bias + term
        mask = None
        if key_padding_mask is not None:
            # (B, N) -> (B, 1, 1, N), True = may attend (SDPA convention)
            mask = ~key_padding_mask[:, None, None, :]
            if bias is not None:
                bias = bias.masked_fill(~mask, float('-inf'))
                mask = None
        attn_mask = bias if bias is not None else mask
        if bias is not None:
            attn_mask = attn_mask.to(q.dtype)
        drop_p = self.attn_drop if self.training else 0.

        if 'v' not in self.rpe:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=drop_p)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            if attn_mask is not None:
                if attn_mask.dtype == torch.bool:
                    attn = attn.masked_fill(~attn_mask, float('-inf'))
                else:
                    attn = attn + attn_mask
            attn = F.dropout(attn.softmax(dim=-1), drop_p)
            out = attn @ v + self.rpe['v'](attn, h, w)
        # (B, heads, N, head_dim) -> (B, N, C)
        out = out.transpose(1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj(out))


class CPVTBlock(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm1(x))``, ``x + mlp(...)``.

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Attention heads.
        mlp_ratio (float): Hidden channels of the MLP over C.
        qkv_bias (bool): Bias in the qkv projection. Defaults to True.
        drop (float): Dropout after projections. Defaults to 0.
        attn_drop (float): Dropout on attention probabilities.
            Defaults to 0.
        drop_path (float): Stochastic depth rate. Defaults to 0.
        norm_cfg (dict): Norm config. Defaults to LN with eps 1e-6.
        rpe_cfg (dict, optional): iRPE arguments; None for no iRPE.
        rpe_on (str): Where iRPE goes. Defaults to 'k'.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 drop: float = 0.,
                 attn_drop: float = 0.,
                 drop_path: float = 0.,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
                 rpe_cfg: Optional[dict] = None,
                 rpe_on: str = 'k') -> None:
        super().__init__()
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = CPVTAttention(embed_dims, num_heads, qkv_bias, attn_drop,
                                  drop, rpe_cfg, rpe_on)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else \
            nn.Identity()
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.mlp = Mlp(embed_dims, int(embed_dims * mlp_ratio), drop)

    def forward(self,
                x: Tensor,
                hw_shape: Tuple[int, int],
                num_skip: int = 0,
                rope: Optional[Tuple[Tensor, Tensor]] = None,
                key_padding_mask: Optional[Tensor] = None) -> Tensor:
        """(B, N, C) -> (B, N, C); arguments as :class:`CPVTAttention`."""
        x = x + self.drop_path(
            self.attn(self.norm1(x), hw_shape, num_skip, rope,
                      key_padding_mask))
        return x + self.drop_path(self.mlp(self.norm2(x)))


@MODELS.register_module()
class CPVT(BaseModule):
    """CPVT backbone: a plain ViT with a switchable position encoding.

    A DeiT-style ViT (16 x 16 patch embedding, pre-norm blocks, LayerNorm)
    whose position information comes from ``pos_encoding``:

    - ``'peg'`` (default): CPVT's Positional Encoding Generator (Sec. 3), a
      depth-wise conv with zero padding after each block in
      ``peg_positions`` (default ``(0,)``: after the first block, the
      paper's best single position; ``(0, 1, 2, 3, 4)`` is its "0-5").
    - ``'none'``: no position information.
    - ``'learnable'``: a table for the ``img_size`` grid, resampled
      bicubically to each input's grid (as DeiT at 384).
    - ``'sine'``: fixed 2D sin-cos embedding added to the patch tokens.
    - ``'rope2d'``: axial 2D rotary embedding of q and k in every block.
    - ``'irpe'``: iRPE (Wu et al., ICCV 2021) in every block's attention,
      configured by ``rpe_cfg``.

    Inputs of any size are padded bottom/right to a multiple of the patch
    size; outputs are NCHW maps at stride ``patch_size`` covering the padded
    grid ``(ceil(H / p), ceil(W / p))``.

    **Padded batches.** MMDetection detectors call ``backbone(images)``
    without masks, so by default the batch padding is image content there
    (as for CNN backbones). A pixel mask -- ``forward(x, padding_mask)``,
    which the ``PaddingAware*`` detectors pass from their data samples
    (:mod:`mmpe.models.detectors.padding_aware`) -- makes padded tokens
    invisible instead: they are never attended to, PEG
    zeroes them before its convolution (so its zero-padding cue is each
    image's own border) and their outputs are zero; every image then gets
    exactly its single-image features on its valid region (except with
    ``'learnable'``, whose table is resampled to the padded grid).

    Args:
        arch (str | dict): Preset name in :attr:`arch_zoo` (``'tiny'``,
            ``'small'``, ``'base'`` and aliases) or a dict with keys
            ``embed_dims``, ``depth``, ``num_heads``, ``mlp_ratio``.
            Defaults to 'small'.
        img_size (int | tuple[int, int]): Pre-training image size; sets the
            grid of the ``'learnable'`` table. Defaults to 224.
        patch_size (int): Patch size p (the output stride). Defaults to 16.
        in_channels (int): Input channels. Defaults to 3.
        out_indices (int | Sequence[int]): Blocks whose outputs are returned
            (negative counts from the end). Defaults to -1.
        pos_encoding (str): One of :attr:`POS_ENCODINGS`. Defaults to 'peg'.
        peg_positions (Sequence[int]): Blocks followed by a PEG (only for
            ``'peg'``). Defaults to (0,).
        peg_kernel_size (int): Odd PEG kernel size. Defaults to 3.
        use_cls_token (bool): Prepend a class token (a skip token for every
            position encoding). Defaults to False (the paper's GAP).
        qkv_bias (bool): Bias in the qkv projections. Defaults to True.
        drop_rate (float): Dropout after position embedding and projections.
            Defaults to 0.
        attn_drop_rate (float): Dropout on attention probabilities.
            Defaults to 0.
        drop_path_rate (float): Stochastic depth rate of the last block,
            increasing linearly from 0. Defaults to 0.
        norm_cfg (dict): Norm config. Defaults to LN with eps 1e-6.
        final_norm (bool): Apply the final norm to every output.
            Defaults to True.
        sine_temperature (float): Temperature of ``'sine'``.
            Defaults to 10000.
        rope_theta (float): Frequency base of ``'rope2d'``. Defaults to 100.
        rpe_cfg (dict, optional): For ``'irpe'``: arguments of
            ``mmpe.models.layers.iRPE`` other than ``head_dim``,
            ``num_heads``, ``on`` and ``skip`` (set from
            ``use_cls_token``), plus ``rpe_on`` (one of
            :data:`RPE_ON_CHOICES`, default 'k'). Defaults to None, i.e.
            ``dict(mode='contextual', method='product', ratio=1.9,
            rpe_on='k')`` for ``'irpe'``.
        frozen_stages (int): -1 freezes nothing; 0 the patch embedding,
            class token and position table; ``k >= 1`` also blocks
            ``0 .. k-1`` and their PEGs; ``depth`` also the final norm.
            Defaults to -1.
        init_cfg (dict | list[dict], optional): Initialisation config, e.g.
            ``dict(type='Pretrained', checkpoint=...)`` with a file made by
            ``tools/model_converters/timm_vit_to_cpvt.py``.
            Defaults to None.
    """

    arch_zoo = {
        **dict.fromkeys(['t', 'tiny', 'deit-t', 'deit-tiny'], {
            'embed_dims': 192,
            'depth': 12,
            'num_heads': 3,
            'mlp_ratio': 4.
        }),
        **dict.fromkeys(['s', 'small', 'deit-s', 'deit-small'], {
            'embed_dims': 384,
            'depth': 12,
            'num_heads': 6,
            'mlp_ratio': 4.
        }),
        **dict.fromkeys(['b', 'base', 'deit-b', 'deit-base'], {
            'embed_dims': 768,
            'depth': 12,
            'num_heads': 12,
            'mlp_ratio': 4.
        }),
    }
    essential_keys = {'embed_dims', 'depth', 'num_heads', 'mlp_ratio'}
    POS_ENCODINGS = ('peg', 'none', 'learnable', 'sine', 'rope2d', 'irpe')

    def __init__(self,
                 arch: Union[str, dict] = 'small',
                 img_size: Union[int, Tuple[int, int]] = 224,
                 patch_size: int = 16,
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = -1,
                 pos_encoding: str = 'peg',
                 peg_positions: Sequence[int] = (0, ),
                 peg_kernel_size: int = 3,
                 use_cls_token: bool = False,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
                 final_norm: bool = True,
                 sine_temperature: float = 10000.,
                 rope_theta: float = 100.,
                 rpe_cfg: Optional[dict] = None,
                 frozen_stages: int = -1,
                 init_cfg: Optional[Union[dict, List[dict]]] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.arch_settings = self._parse_arch(arch)
        embed_dims = self.arch_settings['embed_dims']
        depth = self.arch_settings['depth']
        num_heads = self.arch_settings['num_heads']
        mlp_ratio = self.arch_settings['mlp_ratio']
        self._check_positive('embed_dims', embed_dims)
        self._check_positive('depth', depth)
        self._check_positive('num_heads', num_heads)
        if embed_dims % num_heads != 0:
            raise ValueError(
                f'`num_heads` ({num_heads}) must divide `embed_dims` '
                f'({embed_dims}); choose num_heads among the divisors of '
                f'{embed_dims}')
        if not mlp_ratio > 0:
            raise ValueError(f'`mlp_ratio` must be > 0, got {mlp_ratio}')
        self._check_positive('patch_size', patch_size)
        self._check_positive('in_channels', in_channels)
        if pos_encoding not in self.POS_ENCODINGS:
            raise ValueError(f'Unsupported `pos_encoding` {pos_encoding!r}, '
                             f'please choose from {self.POS_ENCODINGS}')
        img_size = (img_size, img_size) if isinstance(img_size,
                                                      int) else img_size
        if (len(img_size) != 2
                or not all(isinstance(s, int) and s > 0 for s in img_size)):
            raise ValueError(f'`img_size` must be a positive int or a pair of '
                             f'them, got {img_size!r}')
        if not -1 <= frozen_stages <= depth:
            raise ValueError(f'`frozen_stages` must be in [-1, {depth}] '
                             f'(depth), got {frozen_stages}')
        for name, rate in (('drop_rate', drop_rate), ('attn_drop_rate',
                                                      attn_drop_rate),
                           ('drop_path_rate', drop_path_rate)):
            if not 0 <= rate < 1:
                raise ValueError(f'`{name}` must be in [0, 1), got {rate}')

        self.embed_dims = embed_dims
        self.depth = depth
        self.num_heads = num_heads
        self.patch_size = patch_size
        self.pos_encoding = pos_encoding
        self.use_cls_token = use_cls_token
        self.num_skip = 1 if use_cls_token else 0
        self.final_norm = final_norm
        self.frozen_stages = frozen_stages
        self.out_indices = self._parse_out_indices(out_indices, depth)
        self.pretrain_grid = (img_size[0] // patch_size,
                              img_size[1] // patch_size)

        self.patch_embed = nn.Conv2d(
            in_channels, embed_dims, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(
            1, 1, embed_dims)) if use_cls_token else None
        self.pos_embed = None
        self.sincos = None
        self.rope = None
        if pos_encoding == 'learnable':
            num_grid = self.pretrain_grid[0] * self.pretrain_grid[1]
            self.pos_embed = nn.Parameter(
                torch.zeros(1, self.num_skip + num_grid, embed_dims))
        elif pos_encoding == 'sine':
            self.sincos = SinCosPosEmbed2D(embed_dims, sine_temperature)
        elif pos_encoding == 'rope2d':
            self.rope = RoPE2D(embed_dims // num_heads, rope_theta)
        self.drop_after_pos = nn.Dropout(drop_rate)

        block_rpe_cfg, rpe_on = self._parse_rpe_cfg(rpe_cfg, pos_encoding)
        dpr = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.ModuleList([
            CPVTBlock(
                embed_dims,
                num_heads,
                mlp_ratio,
                qkv_bias=qkv_bias,
                drop=drop_rate,
                attn_drop=attn_drop_rate,
                drop_path=dpr[i],
                norm_cfg=norm_cfg,
                rpe_cfg=block_rpe_cfg,
                rpe_on=rpe_on) for i in range(depth)
        ])

        self.peg_positions: Tuple[int, ...] = ()
        self.pegs = nn.ModuleList()
        if pos_encoding == 'peg':
            self.peg_positions = self._parse_peg_positions(
                peg_positions, depth)
            self.pegs.extend(
                PEG(embed_dims, peg_kernel_size)
                for _ in self.peg_positions)
        self.norm = build_norm_layer(norm_cfg, embed_dims)[1] \
            if final_norm else nn.Identity()

        self._init_default_weights()
        self._freeze_stages()

    # ------------------------------------------------------------------ #
    # argument parsing
    @staticmethod
    def _check_positive(name: str, value) -> None:
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f'`{name}` must be a positive int, got '
                             f'{value!r}')

    def _parse_arch(self, arch: Union[str, dict]) -> dict:
        if isinstance(arch, str):
            key = arch.lower()
            if key not in self.arch_zoo:
                raise ValueError(f'Unsupported `arch` {arch!r}, please choose '
                                 f'from {sorted(set(self.arch_zoo))} or pass '
                                 f'a dict with keys '
                                 f'{sorted(self.essential_keys)}')
            return dict(self.arch_zoo[key])
        if isinstance(arch, dict):
            missing = self.essential_keys - set(arch)
            unknown = set(arch) - self.essential_keys
            if missing or unknown:
                raise ValueError(
                    f'Custom `arch` dict must have exactly the keys '
                    f'{sorted(self.essential_keys)}; missing '
                    f'{sorted(missing)}, unknown {sorted(unknown)}')
            return dict(arch)
        raise ValueError(f'`arch` must be a str or a dict, got {arch!r}')

    @staticmethod
    def _parse_out_indices(out_indices: Union[int, Sequence[int]],
                           depth: int) -> Tuple[int, ...]:
        if isinstance(out_indices, int):
            out_indices = [out_indices]
        if not isinstance(out_indices, Sequence) or len(out_indices) == 0:
            raise ValueError(f'`out_indices` must be an int or a non-empty '
                             f'sequence of ints, got {out_indices!r}')
        parsed = []
        for index in out_indices:
            if not isinstance(index, int) or not -depth <= index < depth:
                raise ValueError(
                    f'`out_indices` entry {index!r} is out of range: choose '
                    f'block indices in [{-depth}, {depth - 1}] (depth '
                    f'{depth})')
            parsed.append(index % depth)
        return tuple(sorted(set(parsed)))

    @staticmethod
    def _parse_peg_positions(peg_positions: Sequence[int],
                             depth: int) -> Tuple[int, ...]:
        if isinstance(peg_positions, int):
            peg_positions = [peg_positions]
        if not isinstance(peg_positions, Sequence) or not peg_positions:
            raise ValueError(
                f"`peg_positions` must be a non-empty sequence of block "
                f"indices in [0, {depth - 1}] for pos_encoding='peg' (use "
                f"pos_encoding='none' for no position encoding), got "
                f'{peg_positions!r}')
        for pos in peg_positions:
            if not isinstance(pos, int) or not 0 <= pos < depth:
                raise ValueError(
                    f'`peg_positions` entry {pos!r} is out of range: choose '
                    f'block indices in [0, {depth - 1}] (depth {depth})')
        return tuple(sorted(set(peg_positions)))

    def _parse_rpe_cfg(self, rpe_cfg: Optional[dict], pos_encoding: str
                       ) -> Tuple[Optional[dict], str]:
        if pos_encoding != 'irpe':
            if rpe_cfg is not None:
                raise ValueError(
                    f"`rpe_cfg` is only used with pos_encoding='irpe', got "
                    f'pos_encoding={pos_encoding!r}')
            return None, 'k'
        cfg = dict(
            mode='contextual', method='product', ratio=1.9, rpe_on='k')
        cfg.update(rpe_cfg or {})
        rpe_on = cfg.pop('rpe_on')
        if rpe_on not in RPE_ON_CHOICES:
            raise ValueError(f'Unsupported `rpe_cfg.rpe_on` {rpe_on!r}, '
                             f'please choose from {RPE_ON_CHOICES}')
        for key in ('head_dim', 'num_heads', 'on'):
            if key in cfg:
                raise ValueError(
                    f'`rpe_cfg.{key}` is set by CPVT; remove it (use '
                    f'`rpe_cfg.rpe_on` to choose q/k/v)')
        if cfg.get('skip', self.num_skip) != self.num_skip:
            raise ValueError(
                f"`rpe_cfg.skip` ({cfg['skip']}) must equal the number of "
                f'skip tokens ({self.num_skip}, from use_cls_token); leave it '
                f'out')
        cfg['skip'] = self.num_skip
        return cfg, rpe_on

    # ------------------------------------------------------------------ #
    # weights
    def _init_default_weights(self) -> None:
        """DeiT initialisation: trunc-normal(0.02) linears and tables."""
        for m in self.blocks.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if self.cls_token is not None:
            trunc_normal_(self.cls_token, std=.02)
        if self.pos_embed is not None:
            trunc_normal_(self.pos_embed, std=.02)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Resample a learnable table saved for another grid (as DeiT)."""
        key = prefix + 'pos_embed'
        if self.pos_embed is not None and key in state_dict:
            table = state_dict[key]
            if table.shape != self.pos_embed.shape:
                grid_len = table.shape[1] - self.num_skip
                side = math.isqrt(grid_len)
                if side * side == grid_len and table.shape[-1] == \
                        self.embed_dims:
                    state_dict[key] = resample_pos_embed(
                        table, (side, side), self.pretrain_grid,
                        self.num_skip)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _freeze_stages(self) -> None:
        if self.frozen_stages < 0:
            return
        frozen: List[nn.Module] = [self.patch_embed]
        params = [self.cls_token, self.pos_embed]
        frozen += [self.blocks[i] for i in range(self.frozen_stages)]
        frozen += [
            peg for pos, peg in zip(self.peg_positions, self.pegs)
            if pos < self.frozen_stages
        ]
        if self.frozen_stages == self.depth:
            frozen.append(self.norm)
        for module in frozen:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False
        for param in params:
            if param is not None:
                param.requires_grad = False

    def train(self, mode: bool = True) -> 'CPVT':
        super().train(mode)
        self._freeze_stages()
        return self

    # ------------------------------------------------------------------ #
    def forward(self,
                x: Tensor,
                padding_mask: Optional[Tensor] = None) -> Tuple[Tensor, ...]:
        """Feature maps of the blocks in ``out_indices``.

        Args:
            x (Tensor): Images ``(B, in_channels, H, W)``, any H and W.
            padding_mask (Tensor, optional): ``(B, H, W)`` bool, True on
                padded pixels (bottom/right padding). Defaults to None.

        Returns:
            tuple[Tensor]: One ``(B, embed_dims, ceil(H / p), ceil(W / p))``
            map per entry of ``out_indices``, in block order.
        """
        b, _, H, W = x.shape
        p = self.patch_size
        # bottom/right zero padding keeps token coordinates of every pixel
        x = F.pad(x, (0, (-W) % p, 0, (-H) % p))
        x = self.patch_embed(x)
        hw_shape = (h, w) = (x.shape[2], x.shape[3])
        # (B, C, h, w) -> (B, h*w, C)
        x = x.flatten(2).transpose(1, 2)

        token_mask = None  # (B, h, w), True on padded tokens
        if padding_mask is not None:
            token_mask = self._token_padding_mask(padding_mask, hw_shape)
            if not token_mask.any():
                token_mask = None
        key_mask = None  # (B, num_skip + h*w)
        if token_mask is not None:
            key_mask = F.pad(token_mask.flatten(1), (self.num_skip, 0))

        if self.sincos is not None:
            x = x + self.sincos(hw_shape, x.device, x.dtype)[None]
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1)
        if self.pos_embed is not None:
            x = x + resample_pos_embed(self.pos_embed, self.pretrain_grid,
                                       hw_shape, self.num_skip)
        if token_mask is not None:
            x = x.masked_fill(key_mask[..., None], 0.)
        x = self.drop_after_pos(x)
        rope = None
        if self.rope is not None:
            rope = self.rope(hw_shape, x.device, x.dtype)

        pegs = dict(zip(self.peg_positions, self.pegs))
        outs = []
        for i, block in enumerate(self.blocks):
            x = block(x, hw_shape, self.num_skip, rope, key_mask)
            if i in pegs:
                x = pegs[i](x, hw_shape, token_mask, self.num_skip)
            if i in self.out_indices:
                out = self.norm(x[:, self.num_skip:])
                if token_mask is not None:
                    out = out.masked_fill(token_mask.flatten(1)[..., None],
                                          0.)
                # (B, h*w, C) -> (B, C, h, w)
                outs.append(out.transpose(1, 2).reshape(b, -1, h, w))
        return tuple(outs)

    def _token_padding_mask(self, padding_mask: Tensor,
                            hw_shape: Tuple[int, int]) -> Tensor:
        """Pixel mask ``(B, H, W)`` -> token mask ``(B, h, w)``.

        A token is padding only if all of its pixels are.
        """
        p = self.patch_size
        h, w = hw_shape
        if padding_mask.dim() != 3:
            raise ValueError(f'`padding_mask` must be (B, H, W), got shape '
                             f'{tuple(padding_mask.shape)}')
        valid = (~padding_mask.bool()).unsqueeze(1).float()
        H, W = valid.shape[-2:]
        valid = F.pad(valid, (0, w * p - W, 0, h * p - H))
        valid = F.max_pool2d(valid, p, p)
        return valid[:, 0] < 0.5


def timm_vit_to_cpvt(
        state_dict: Dict[str, Tensor],
        pos_encoding: str = 'peg',
        use_cls_token: bool = False) -> 'OrderedDict[str, Tensor]':
    """Map a timm DeiT/ViT state dict to :class:`CPVT` keys.

    Handles timm's ``VisionTransformer`` layout (e.g.
    ``deit_tiny_patch16_224``, ``vit_small_patch16_224``)::

        patch_embed.proj.*               -> patch_embed.*
        cls_token                        -> cls_token (kept iff use_cls_token)
        pos_embed                        -> pos_embed (kept iff 'learnable';
                                            class row kept iff use_cls_token)
        blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}.*
                                         -> same
        norm.* (or fc_norm.* when norm is absent) -> norm.*
        head*, dist_token                -> dropped

    Any other key (LayerScale, q/k norms, ...) is a layout CPVT does not
    have and raises ``ValueError``.

    Args:
        state_dict (dict[str, Tensor]): timm model weights (a ``module.``
            prefix is stripped).
        pos_encoding (str): Target ``CPVT.pos_encoding``. Defaults to 'peg'.
        use_cls_token (bool): Target ``CPVT.use_cls_token``.
            Defaults to False.

    Returns:
        OrderedDict[str, Tensor]: CPVT weights; PEG / RoPE / iRPE parameters
        are absent (newly initialised when loading).
    """
    if pos_encoding not in CPVT.POS_ENCODINGS:
        raise ValueError(f'Unsupported `pos_encoding` {pos_encoding!r}, '
                         f'please choose from {CPVT.POS_ENCODINGS}')
    state_dict = {
        (k[len('module.'):] if k.startswith('module.') else k): v
        for k, v in state_dict.items()
    }
    block_key = re.compile(
        r'^blocks\.(\d+)\.(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|'
        r'mlp\.fc2)\.(weight|bias)$')
    out: 'OrderedDict[str, Tensor]' = OrderedDict()
    unknown = []
    for key, value in state_dict.items():
        if key.startswith('patch_embed.proj.'):
            out['patch_embed.' + key[len('patch_embed.proj.'):]] = value
        elif key == 'cls_token':
            if use_cls_token:
                out[key] = value
        elif key == 'pos_embed':
            if pos_encoding == 'learnable':
                out[key] = _convert_pos_embed(value, state_dict,
                                              use_cls_token)
        elif block_key.match(key) or key.startswith('norm.'):
            out[key] = value
        elif key.startswith('fc_norm.'):
            if 'norm.weight' not in state_dict:
                out['norm.' + key[len('fc_norm.'):]] = value
        elif key.startswith('head') or key == 'dist_token':
            continue
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f'timm_vit_to_cpvt: keys with no CPVT counterpart '
                         f'(unsupported timm layout): {unknown[:10]}')
    return out


def _convert_pos_embed(table: Tensor, state_dict: Dict[str, Tensor],
                       use_cls_token: bool) -> Tensor:
    """timm ``pos_embed`` ``(1, prefix + h0*w0, C)`` -> CPVT's table."""
    n = table.shape[1]
    if math.isqrt(n)**2 == n:  # timm's no_embed_class: no prefix rows
        prefix, grid = table[:, :0], table
    else:
        num_prefix = int('cls_token' in state_dict) + int(
            'dist_token' in state_dict)
        prefix, grid = table[:, :num_prefix], table[:, num_prefix:]
        if math.isqrt(grid.shape[1])**2 != grid.shape[1]:
            raise ValueError(f'timm_vit_to_cpvt: cannot split pos_embed of '
                             f'length {n} into prefix rows and a square grid')
    if not use_cls_token:
        return grid
    cls_row = prefix[:, :1] if prefix.shape[1] else table.new_zeros(
        1, 1, table.shape[-1])
    return torch.cat([cls_row, grid], dim=1)
