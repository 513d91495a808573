"""Pre-norm ViT block (DeiT / timm parameter layout) on the attention core.

``x + attn(norm1(x))`` then ``x + mlp(norm2(x))`` (Dosovitskiy et al. 2021,
Eq. 2-3), with :class:`~mmpe.models.layers.PEAttention` as the attention,
so RoPE, iRPE (Wu et al. 2021, Eq. 16-17), key padding and class tokens
work exactly as in mmpe's DETR encoders. A block with a ``window_size``
attends inside non-overlapping windows (ViTDet, Li et al. 2022, Sec. 3;
layout in :mod:`~mmpe.models.layers.windows.window`).
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks.drop import DropPath
from torch import Tensor

from ..attention.core import PEAttention
from ....utils.arg_checks import check_int
from ..common.arg_checks import check_choice
from ..windows.window import (WINDOW_PADDINGS, merge_windows, window_key_mask,
                              window_table, window_tokens)


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


class SwiGLU(nn.Module):
    """Gated feed-forward: ``fc2(norm(SiLU(fc1_g(x)) * fc1_x(x)))`` (Shazeer
    2020, Eq. 6), with EVA-02's sub-LN ``norm`` on the hidden channels (Fang
    et al., "EVA-02", 2024; timm's ``SwiGLU``, ``scale_mlp=True``) or none.

    Args:
        embed_dims (int): Input and output channels C.
        hidden_dims (int): Hidden channels.
        drop (float): Dropout after the gate and after fc2. Defaults to 0.
        sub_norm_cfg (dict, optional): The norm of the hidden channels.
            Defaults to None (none).
    """

    def __init__(self,
                 embed_dims: int,
                 hidden_dims: int,
                 drop: float = 0.,
                 sub_norm_cfg: Optional[dict] = None) -> None:
        super().__init__()
        self.fc1_g = nn.Linear(embed_dims, hidden_dims)
        self.fc1_x = nn.Linear(embed_dims, hidden_dims)
        self.act = nn.SiLU()
        self.norm = nn.Identity() if sub_norm_cfg is None else \
            build_norm_layer(sub_norm_cfg, hidden_dims)[1]
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        """(B, N, C) -> (B, N, C)."""
        hidden = self.drop(self.act(self.fc1_g(x)) * self.fc1_x(x))
        return self.drop(self.fc2(self.norm(hidden)))


#: The feed-forward of a block (``ViTBlock(mlp_type=...)``)
MLP_TYPES = ('mlp', 'swiglu', 'swiglu-subln')


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch, ``x * gamma`` (CaiT, Touvron
    et al. 2021, Eq. 4; DINOv2 / DINOv3's ``ls1`` / ``ls2``).

    Args:
        embed_dims (int): Channels C.
        init_value (float): Initial value of every ``gamma`` entry.
    """

    def __init__(self, embed_dims: int, init_value: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((embed_dims, ), init_value))

    def forward(self, x: Tensor) -> Tensor:
        """(..., C) -> (..., C)."""
        return x * self.gamma


class ViTAttention(PEAttention):
    """Self-attention with timm's ``qkv`` / ``proj`` linear layers.

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads; must divide C.
        qkv_bias (bool): Bias in the qkv projection. Defaults to True.
        proj_drop (float): Dropout after the output projection.
            Defaults to 0.
        **kwargs: :class:`PEAttention`'s ``attn_drop``, ``rpe_cfg``,
            ``rpe_on``, ``attn_impl``, ``skip``.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 qkv_bias: bool = True,
                 proj_drop: float = 0.,
                 **kwargs) -> None:
        super().__init__(embed_dims, num_heads, **kwargs)
        self.qkv = nn.Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self,
                x: Tensor,
                hw_shape: Tuple[int, int],
                rope: Optional[Tuple[Tensor, Tensor]] = None,
                key_padding_mask: Optional[Tensor] = None) -> Tensor:
        """Self-attention over ``skip + h * w`` tokens.

        Args:
            x (Tensor): ``(B, N, C)`` with ``N = skip + h * w``.
            hw_shape (tuple[int, int]): Token grid ``(h, w)``.
            rope (tuple[Tensor, Tensor], optional): ``(cos, sin)`` of a
                rotary embedding, see :meth:`PEAttention.attend`.
            key_padding_mask (Tensor, optional): ``(B, N)`` bool, True on
                padded tokens, which are never attended to.

        Returns:
            Tensor: ``(B, N, C)``.
        """
        b, n, c = x.shape
        # (B, N, 3C) -> (3, B, heads, N, head_dim)
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads,
                                  self.head_dims).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        out = self.attend(q, k, v, hw_shape, key_padding_mask, rope=rope)
        return self.proj_drop(self.proj(self.merge_heads(out)))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # mmpe < 0.2 kept the tables in a ModuleDict: 'rpe.k.table'
        for letter in 'qkv':
            old = f'{prefix}rpe.{letter}.table'
            if old in state_dict:
                state_dict[f'{prefix}rpe_{letter}.table'] = state_dict.pop(old)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class ViTBlock(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm1(x))``, ``x + mlp(...)``.

    With ``window_size = S > 0`` the attention is ViTDet's window attention
    (Li et al. 2022, Sec. 3): the normed tokens are padded bottom/right to
    whole ``S x S`` windows and each window attends within itself; the
    padded tokens are masked keys (``window_padding='masked'``) or zero
    tokens attended to (``'zeros'``, detectron2's ViTDet), and are cropped
    after the attention. Positions
    stay those of the full grid where an encoding is per token (RoPE: each
    token keeps its entry of the ``(h, w)`` tables) and are the window's
    where an encoding is per pair (iRPE: one ``(S, S)`` bucket plan shared
    by all windows, which equals the full grid's relative positions inside
    a window).

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Attention heads.
        mlp_ratio (float): Hidden channels of the MLP over C.
        qkv_bias (bool): Bias in the qkv projection. Defaults to True.
        drop (float): Dropout after projections. Defaults to 0.
        drop_path (float): Stochastic depth rate. Defaults to 0.
        norm_cfg (dict): Norm config. Defaults to LN with eps 1e-6.
        window_size (int): Window side S; 0 attends globally. Windows take
            no skip (class) tokens. Defaults to 0.
        mlp_type (str): The feed-forward, one of :data:`MLP_TYPES`: GELU
            :class:`Mlp`, :class:`SwiGLU`, or SwiGLU with a sub-LN of the
            hidden channels (``norm_cfg``; EVA-02). Defaults to 'mlp'.
        layer_scale_init (float, optional): With a value, each residual
            branch is scaled by a :class:`LayerScale` (``ls1`` after the
            attention, ``ls2`` after the MLP; DINOv2 / DINOv3) initialised
            to it. Defaults to None (no scale).
        window_padding (str): What attention makes of the tokens that pad
            the grid to whole windows, one of
            :data:`~mmpe.models.layers.windows.window.WINDOW_PADDINGS`:
            masked keys (``'masked'``) or zero tokens every query attends to
            (``'zeros'``, as detectron2's ViTDet; refused with RoPE, whose
            tables have no row for them). Defaults to 'masked'.
        **attn_kwargs: :class:`PEAttention`'s ``attn_drop``, ``rpe_cfg``,
            ``rpe_on``, ``attn_impl``, ``skip``.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 drop: float = 0.,
                 drop_path: float = 0.,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
                 window_size: int = 0,
                 window_padding: str = 'masked',
                 mlp_type: str = 'mlp',
                 layer_scale_init: Optional[float] = None,
                 **attn_kwargs) -> None:
        super().__init__()
        check_int('window_size', window_size, minimum=0, hint='0: global')
        if window_size and attn_kwargs.get('skip'):
            raise ValueError(
                f'`window_size` {window_size} with skip='
                f"{attn_kwargs['skip']} tokens: windows have no place for "
                'class tokens; choose window_size=0 or skip=0')
        check_choice('window_padding', window_padding, WINDOW_PADDINGS)
        self.window_size = window_size
        self.window_padding = window_padding
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = ViTAttention(
            embed_dims, num_heads, qkv_bias, proj_drop=drop, **attn_kwargs)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else \
            nn.Identity()
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        check_choice('mlp_type', mlp_type, MLP_TYPES)
        hidden = int(embed_dims * mlp_ratio)
        if mlp_type == 'mlp':
            self.mlp = Mlp(embed_dims, hidden, drop)
        else:
            self.mlp = SwiGLU(embed_dims, hidden, drop, norm_cfg
                              if mlp_type == 'swiglu-subln' else None)
        self.ls1, self.ls2 = nn.Identity(), nn.Identity()
        if layer_scale_init is not None:
            self.ls1 = LayerScale(embed_dims, layer_scale_init)
            self.ls2 = LayerScale(embed_dims, layer_scale_init)

    def forward(self,
                x: Tensor,
                hw_shape: Tuple[int, int],
                rope: Optional[Tuple[Tensor, Tensor]] = None,
                key_padding_mask: Optional[Tensor] = None) -> Tensor:
        """(B, N, C) -> (B, N, C); arguments as :class:`ViTAttention`
        (``hw_shape`` and ``rope`` of the full grid in both kinds of block).
        """
        y = self.norm1(x)
        if self.window_size:
            y = self._window_attn(y, hw_shape, rope, key_padding_mask)
        else:
            y = self.attn(y, hw_shape, rope, key_padding_mask)
        x = x + self.drop_path(self.ls1(y))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))

    def _window_attn(self, x: Tensor, hw_shape: Tuple[int, int],
                     rope: Optional[Tuple[Tensor, Tensor]],
                     key_padding_mask: Optional[Tensor]) -> Tensor:
        """Attention inside the windows of the grid: ``(B, h * w, C)`` ->
        ``(B, h * w, C)``."""
        s = self.window_size
        b = x.shape[0]
        windows = window_tokens(x, hw_shape, s)  # (B*nW, S*S, C)
        mask = window_key_mask(key_padding_mask, b, hw_shape, s, x.device,
                               self.window_padding)
        if rope is not None and self.window_padding == 'zeros':
            raise ValueError(
                "window_padding='zeros' with RoPE: the zero tokens that pad "
                'the grid to whole windows have no position in the RoPE '
                "tables; choose window_padding='masked' or an encoding "
                'without rotation')
        if rope is not None:  # (B*nW, H | 1, S*S, D) each
            rope = tuple(window_table(t, b, hw_shape, s) for t in rope)
        out = self.attn(windows, (s, s), rope, mask)
        return merge_windows(out, hw_shape, s)

    def extra_repr(self) -> str:
        if not self.window_size:
            return ''
        return f'window_size={self.window_size}' + (
            f', window_padding={self.window_padding!r}'
            if self.window_padding != 'masked' else '')
