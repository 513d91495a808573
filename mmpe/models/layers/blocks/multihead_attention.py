"""Multi-head attention with relative position encoding in mmcv's parameter
layout (for the DETR family's encoders).

A drop-in for mmcv's :class:`~mmcv.cnn.bricks.transformer.MultiheadAttention`
that adds the iRPE terms of Wu et al., "Rethinking and Improving Relative
Position Encoding for Vision Transformer" (ICCV 2021), Eq. 13-17, or rotates
queries and keys with 2D RoPE (axial or RoPE-Mixed, Heo et al., ECCV 2024),
computed by the attention core :class:`~mmpe.models.layers.PEAttention`.
"""
from typing import Dict, Optional, Sequence

import torch.nn.functional as F
from mmcv.cnn.bricks.drop import build_dropout
from torch import Tensor, nn

from mmdet.registry import MODELS
from ..attention.core import PEAttention
from ..encodings.rope2d import RoPE2D
from ..encodings.rope_coords import COORD_DEFAULTS
from ..encodings.rope_mixed import RoPEMixed

#: ``rope_cfg['type']`` -> the module that gives ``(cos, sin)`` for a grid
ROPE_TYPES = {'rope2d': RoPE2D, 'rope-mixed': RoPEMixed}


# 'iRPEMultiheadAttention': the registry name before the rename (configs)
@MODELS.register_module(
    name=['PEMultiheadAttention', 'iRPEMultiheadAttention'])
class PEMultiheadAttention(PEAttention):
    """Multi-head attention with iRPE on queries, keys and/or values, or 2D
    RoPE on queries and keys.

    Parameter names equal those of mmcv's ``MultiheadAttention``
    (``attn.in_proj_weight``, ``attn.in_proj_bias``, ``attn.out_proj.*``),
    so a DETR checkpoint loads with only the RPE tables (``rpe_q``,
    ``rpe_k``, ``rpe_v``) or RoPE-Mixed frequencies (``rope.freqs``)
    missing. With all-zero tables (or frequencies) the output equals mmcv's
    ``MultiheadAttention`` with the same weights.

    Args:
        embed_dims (int): The embedding dimension.
        num_heads (int): Number of attention heads; must divide embed_dims.
        attn_drop (float): Dropout on the attention probabilities.
            Defaults to 0.
        proj_drop (float): Dropout after the output projection.
            Defaults to 0.
        dropout_layer (dict, optional): Config of the dropout on the
            shortcut branch, as in mmcv. Defaults to Dropout(0).
        batch_first (bool): Whether inputs are (bs, n, dims) instead of
            (n, bs, dims). Defaults to False.
        rpe_cfg (dict, optional): Arguments of :class:`iRPE` other than
            ``head_dim``, ``num_heads`` and ``on``. None disables RPE: the
            layer is then plain multi-head attention. Defaults to None.
        rpe_on (str): Where iRPE goes, one of ``'q'``, ``'k'``, ``'v'``,
            ``'qk'``, ``'kv'``, ``'qv'``, ``'qkv'``. Defaults to ``'k'``.
        attn_impl (str): ``'auto'``, ``'explicit'``, ``'chunked'``,
            ``'sdpa'`` or ``'flex'``, see :class:`PEAttention`. Defaults to
            ``'auto'``.
        chunk_size (int, optional): Query rows per chunk of the chunked
            backend, see :class:`PEAttention`. Defaults to None
            (automatic).
        rope_cfg (dict, optional): Rotary embedding of the grid tokens:
            ``dict(type='rope2d', theta=100.)`` (:class:`RoPE2D`) or
            ``dict(type='rope-mixed', theta=10., rotate=True)``
            (:class:`RoPEMixed`, learnable frequencies of this layer); the
            token positions come with each call (``rope_pos``, integer
            indices by default). iRPE, where also on, reads the unrotated q
            and k. None: no RoPE.
            Defaults to None.
        bias_cfg (dict, optional): A per-head bias of the grid offset
            (Swin-V2's log-CPB, 2D ALiBi, LookHere), see
            :class:`PEAttention`. Defaults to None.
        init_cfg (dict, optional): Initialisation config. Defaults to None.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 attn_drop: float = 0.,
                 proj_drop: float = 0.,
                 dropout_layer: Optional[Dict] = dict(
                     type='Dropout', drop_prob=0.),
                 batch_first: bool = False,
                 rpe_cfg: Optional[Dict] = None,
                 rpe_on: str = 'k',
                 attn_impl: str = 'auto',
                 rope_cfg: Optional[Dict] = None,
                 chunk_size: Optional[int] = None,
                 bias_cfg: Optional[Dict] = None,
                 init_cfg: Optional[Dict] = None,
                 **kwargs) -> None:
        if 'dropout' in kwargs:  # mmcv's deprecated alias, kept for configs
            attn_drop = kwargs.pop('dropout')
            dropout_layer = dict(type='Dropout', drop_prob=attn_drop)
        if kwargs:
            raise ValueError(f'Unexpected arguments {sorted(kwargs)} for '
                             'PEMultiheadAttention')
        super().__init__(
            embed_dims,
            num_heads,
            attn_drop=attn_drop,
            rpe_cfg=rpe_cfg,
            rpe_on=rpe_on,
            attn_impl=attn_impl,
            chunk_size=chunk_size,
            bias_cfg=bias_cfg,
            init_cfg=init_cfg)
        self.batch_first = batch_first
        # An nn.MultiheadAttention for mmcv's parameter names; the forward
        # reads its weights and runs PEAttention.attend.
        self.attn = nn.MultiheadAttention(embed_dims, num_heads, attn_drop)
        self.proj_drop = nn.Dropout(proj_drop)
        self.dropout_layer = build_dropout(
            dropout_layer) if dropout_layer else nn.Identity()
        self.rope = None if rope_cfg is None else self._build_rope(rope_cfg)

    def _build_rope(self, rope_cfg: Dict) -> nn.Module:
        cfg = dict(rope_cfg)
        kind = cfg.pop('type', None)
        if kind not in ROPE_TYPES:
            raise ValueError(f'Unsupported `rope_cfg.type` {kind!r}, please '
                             f'choose from {tuple(ROPE_TYPES)}')
        coord_keys = sorted(set(cfg) & set(COORD_DEFAULTS))
        if coord_keys:
            raise ValueError(
                f'Unsupported `rope_cfg` keys {coord_keys} in an attention '
                'layer: token coordinates are made once per batch for all '
                'layers and passed as `rope_pos`; please set them in the '
                "detector's `encoder_pe.relative` (or build "
                '`RoPECoords` where the grid and padding mask are known)')
        if kind == 'rope-mixed':
            cfg['num_heads'] = self.num_heads
        return ROPE_TYPES[kind](self.head_dims, **cfg)

    def forward(self,
                query: Tensor,
                key: Optional[Tensor] = None,
                value: Optional[Tensor] = None,
                identity: Optional[Tensor] = None,
                query_pos: Optional[Tensor] = None,
                key_pos: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None,
                spatial_shape: Optional[Sequence[int]] = None,
                rope_pos: Optional[Tensor] = None,
                **kwargs) -> Tensor:
        """Attention with iRPE terms, residual and dropout as in mmcv.

        Args:
            query (Tensor): (bs, n, dims) if batch_first else (n, bs, dims).
            key (Tensor, optional): Same layout as query; defaults to query.
                iRPE needs key and query on the same grid.
            value (Tensor, optional): Same shape as key; defaults to key.
            identity (Tensor, optional): Shortcut input; defaults to query.
            query_pos (Tensor, optional): Added to query before projection.
            key_pos (Tensor, optional): Added to key; defaults to query_pos
                when shapes match.
            attn_mask (Tensor, optional): (n, n) bool (True = not allowed)
                or additive float mask.
            key_padding_mask (Tensor, optional): (bs, n) bool, True at
                padded keys.
            spatial_shape (tuple[int, int], optional): Token grid
                ``(height, width)``; ``n == skip + height * width`` (skip
                tokens first). Required when RPE or RoPE is on.
            rope_pos (Tensor, optional): ``(bs, height * width, 2)`` or
                ``(height * width, 2)`` token positions ``(y, x)`` for RoPE
                (:class:`~mmpe.models.layers.RoPECoords`, one
                per batch for every layer). None: integer token positions.

        Returns:
            Tensor: Same shape as query.
        """
        if key is None:
            key = query
        if value is None:
            value = key
        if identity is None:
            identity = query
        if key_pos is None and query_pos is not None \
                and query_pos.shape == key.shape:
            key_pos = query_pos
        if query_pos is not None:
            query = query + query_pos
        if key_pos is not None:
            key = key + key_pos
        if not self.batch_first:
            # (n, bs, dims) -> (bs, n, dims)
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))

        out = self.attention(query, key, value, attn_mask, key_padding_mask,
                             spatial_shape, rope_pos)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return identity + self.dropout_layer(self.proj_drop(out))

    def attention(self, query: Tensor, key: Tensor, value: Tensor,
                  attn_mask: Optional[Tensor],
                  key_padding_mask: Optional[Tensor],
                  spatial_shape: Optional[Sequence[int]],
                  rope_pos: Optional[Tensor] = None) -> Tensor:
        """Projections around :meth:`PEAttention.attend`, batch-first.

        Args:
            query, key, value (Tensor): (bs, n, dims), position already
                added to query and key.
            attn_mask (Tensor, optional): (n_q, n_k) mask.
            key_padding_mask (Tensor, optional): (bs, n_k), True at padding.
            spatial_shape (tuple[int, int], optional): Token grid (h, w).
            rope_pos (Tensor, optional): RoPE positions (see
                :meth:`forward`); None: integer token positions.

        Returns:
            Tensor: (bs, n_q, dims), after the output projection.
        """
        w_q, w_k, w_v = self.attn.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.attn.in_proj_bias.chunk(3)
        q = self.split_heads(F.linear(query, w_q, b_q))
        k = self.split_heads(F.linear(key, w_k, b_k))
        v = self.split_heads(F.linear(value, w_v, b_v))
        rope = None
        if self.rope is not None:
            if spatial_shape is None:
                raise ValueError(
                    f'{type(self).__name__} needs `spatial_shape=(height, '
                    'width)` of the token grid when RoPE is on; got None')
            rope = self.rope(spatial_shape, q.device, q.dtype, pos=rope_pos)
        out = self.attend(q, k, v, spatial_shape, key_padding_mask, attn_mask,
                          rope)
        return self.attn.out_proj(self.merge_heads(out))
