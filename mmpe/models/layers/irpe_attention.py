"""Multi-head self-attention with image relative position encoding (iRPE).

A drop-in for mmcv's :class:`~mmcv.cnn.bricks.transformer.MultiheadAttention`
that adds the iRPE terms of Wu et al., "Rethinking and Improving Relative
Position Encoding for Vision Transformer" (ICCV 2021), Eq. 13-17:

.. math::

    e_{ij} = \\frac{(x_i W^Q)(x_j W^K)^T + b_{ij}}{\\sqrt{d}}, \\quad
    b_{ij} = (x_i W^Q) r^K_{ij} + (x_j W^K) r^Q_{ij}, \\quad
    z_i = \\sum_j a_{ij} (x_j W^V + r^V_{ij}).

As in the authors' release, queries are scaled by :math:`1/\\sqrt{d}` before
they meet :math:`r^K` and keys before they meet :math:`r^Q`.
"""
import math
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmcv.cnn.bricks.drop import build_dropout
from mmengine.model import BaseModule
from torch import Tensor, nn

from mmdet.registry import MODELS
from .irpe import iRPE

RPE_ON_CHOICES = ('q', 'k', 'v', 'qk', 'kv', 'qv', 'qkv')


@MODELS.register_module()
class iRPEMultiheadAttention(BaseModule):
    """Multi-head attention with iRPE on queries, keys and/or values.

    Parameter names equal those of mmcv's ``MultiheadAttention``
    (``attn.in_proj_weight``, ``attn.in_proj_bias``, ``attn.out_proj.*``),
    so a DETR checkpoint loads with only the RPE tables (``rpe_q``,
    ``rpe_k``, ``rpe_v``) missing. With all-zero tables (the default init)
    the output equals mmcv's ``MultiheadAttention`` with the same weights.

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
            ``head_dim``, ``num_heads`` and ``on`` (e.g. ``mode``, ``method``,
            ``ratio``, ``index``, ``shared_head``, ``skip``). None disables
            RPE: the layer is then plain multi-head attention.
            Defaults to None.
        rpe_on (str): Where iRPE goes, one of ``'q'``, ``'k'``, ``'v'``,
            ``'qk'``, ``'kv'``, ``'qv'``, ``'qkv'``. Defaults to ``'k'``.
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
                 init_cfg: Optional[Dict] = None,
                 **kwargs) -> None:
        super().__init__(init_cfg=init_cfg)
        if 'dropout' in kwargs:  # mmcv's deprecated alias, kept for configs
            attn_drop = kwargs.pop('dropout')
            dropout_layer = dict(type='Dropout', drop_prob=attn_drop)
        if kwargs:
            raise ValueError(f'Unexpected arguments {sorted(kwargs)} for '
                             'iRPEMultiheadAttention')
        if not isinstance(embed_dims, int) or embed_dims <= 0:
            raise ValueError(
                f'`embed_dims` must be a positive int, got {embed_dims!r}')
        if not isinstance(num_heads, int) or num_heads <= 0 \
                or embed_dims % num_heads != 0:
            raise ValueError(
                f'`num_heads` must be a positive int dividing `embed_dims` '
                f'({embed_dims}), got {num_heads!r}')
        if rpe_on not in RPE_ON_CHOICES:
            raise ValueError(f'Unsupported `rpe_on` {rpe_on!r}, please choose '
                             f'from {RPE_ON_CHOICES}')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.batch_first = batch_first
        self.attn_drop_prob = float(attn_drop)

        # Kept as an nn.MultiheadAttention so parameter names match mmcv's;
        # the forward below reads its weights directly.
        self.attn = nn.MultiheadAttention(embed_dims, num_heads, attn_drop)
        self.proj_drop = nn.Dropout(proj_drop)
        self.dropout_layer = build_dropout(
            dropout_layer) if dropout_layer else nn.Identity()

        self.rpe_cfg = None if rpe_cfg is None else dict(rpe_cfg)
        self.rpe_on = rpe_on if rpe_cfg is not None else ''
        for letter in 'qkv':
            rpe = None
            if letter in self.rpe_on:
                cfg = dict(self.rpe_cfg)
                for key in ('head_dim', 'num_heads', 'on', 'type'):
                    cfg.pop(key, None)
                rpe = iRPE(
                    head_dim=self.head_dims,
                    num_heads=num_heads,
                    on=letter,
                    **cfg)
            setattr(self, f'rpe_{letter}', rpe)

    @property
    def skip(self) -> int:
        """Number of leading tokens outside the grid (class tokens)."""
        for rpe in (self.rpe_q, self.rpe_k, self.rpe_v):
            if rpe is not None:
                return rpe.skip
        return 0

    def _split_heads(self, x: Tensor) -> Tensor:
        # (bs, n, dims) -> (bs, heads, n, head_dims)
        bs, n, _ = x.shape
        return x.view(bs, n, self.num_heads, self.head_dims).transpose(1, 2)

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
                **kwargs) -> Tensor:
        """Attention with iRPE terms, residual and dropout as in mmcv.

        Args:
            query (Tensor): (bs, n, dims) if batch_first else (n, bs, dims).
            key (Tensor, optional): Same layout as query, (bs, n, dims);
                defaults to query. iRPE needs key and query on the same grid.
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
                tokens first). Required when RPE is on.

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
                             spatial_shape)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return identity + self.dropout_layer(self.proj_drop(out))

    def attention(self, query: Tensor, key: Tensor, value: Tensor,
                  attn_mask: Optional[Tensor],
                  key_padding_mask: Optional[Tensor],
                  spatial_shape: Optional[Sequence[int]]) -> Tensor:
        """The attention itself, batch-first, before residual and dropout.

        Args:
            query, key, value (Tensor): (bs, n, dims), position already
                added to query and key.
            attn_mask (Tensor, optional): (n_q, n_k) mask.
            key_padding_mask (Tensor, optional): (bs, n_k), True at padding.
            spatial_shape (tuple[int, int], optional): Token grid (h, w).

        Returns:
            Tensor: (bs, n_q, dims), after the output projection.
        """
        w_q, w_k, w_v = self.attn.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.attn.in_proj_bias.chunk(3)
        # (bs, n, dims) -> (bs, heads, n, head_dims)
        q = self._split_heads(F.linear(query, w_q, b_q))
        k = self._split_heads(F.linear(key, w_k, b_k))
        v = self._split_heads(F.linear(value, w_v, b_v))
        scale = 1.0 / math.sqrt(self.head_dims)
        q = q * scale

        height = width = 0
        if self.rpe_on:
            height, width = self._check_grid(q, k, spatial_shape)

        logits = q @ k.transpose(-2, -1)  # (bs, heads, n_q, n_k)
        if self.rpe_k is not None:
            logits = logits + self.rpe_k(q, height, width)
        if self.rpe_q is not None:
            logits = logits + self.rpe_q(k * scale, height, width)
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                logits = logits.masked_fill(attn_mask, float('-inf'))
            else:
                logits = logits + attn_mask
        if key_padding_mask is not None:
            # (bs, n_k) -> (bs, 1, 1, n_k)
            logits = logits.masked_fill(
                key_padding_mask[:, None, None, :].bool(), float('-inf'))

        attn = logits.softmax(dim=-1)
        attn = F.dropout(attn, self.attn_drop_prob, self.training)
        out = attn @ v  # (bs, heads, n_q, head_dims)
        if self.rpe_v is not None:
            out = out + self.rpe_v(attn, height, width)
        # (bs, heads, n, head_dims) -> (bs, n, dims)
        out = out.transpose(1, 2).flatten(2)
        return self.attn.out_proj(out)

    def _check_grid(self, q: Tensor, k: Tensor,
                    spatial_shape: Optional[Sequence[int]]) -> Tuple[int, int]:
        if spatial_shape is None:
            raise ValueError(
                'iRPEMultiheadAttention needs `spatial_shape=(height, width)` '
                'of the token grid when RPE is on (rpe_on='
                f'{self.rpe_on!r}); got None')
        height, width = (int(s) for s in spatial_shape)
        expected = self.skip + height * width
        if q.shape[2] != expected or k.shape[2] != expected:
            raise ValueError(
                f'`spatial_shape` {(height, width)} with skip={self.skip} '
                f'means {expected} tokens, but query has {q.shape[2]} and '
                f'key has {k.shape[2]}')
        return height, width
