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
import warnings
from typing import Dict, Optional, Sequence, Set, Tuple

import torch
import torch.nn.functional as F
from mmcv.cnn.bricks.drop import build_dropout
from mmengine.model import BaseModule
from torch import Tensor, nn

from mmdet.registry import MODELS
from .irpe import iRPE
from .irpe_flex import (flex_cache_key, flex_unsupported_reason,
                        irpe_flex_attention)

RPE_ON_CHOICES = ('q', 'k', 'v', 'qk', 'kv', 'qv', 'qkv')
ATTN_IMPL_CHOICES = ('auto', 'explicit', 'flex')

# dtypes FlexAttention compiles for on CPU (PyTorch 2.13)
_FLEX_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (device type, dtype) whose compilation failed once: not retried
_FLEX_FAILED: Set[tuple] = set()
# kernels 'auto' has compiled (one per grid, batch, dtype, config): bounded
# like torch._dynamo's recompile limit, past which dynamo would run
# FlexAttention eagerly (unfused)
_FLEX_KEYS: Set[tuple] = set()
MAX_FLEX_KERNELS = 8
# 'auto' on CPU (inference) takes the fused path only when the (B, H, L, L)
# attention bias it avoids would take at least this many bytes: measured on 2
# cores (docs/benchmark.md), FlexAttention's CPU forward is slower than the
# explicit path (SDPA with the bias as its mask) and compiles per grid, so
# on CPU it pays off only where memory is the limit. 0: always on CPU.
FLEX_CPU_MIN_BYTES = 2**30
_WARNED: Set[str] = set()
# device types where _MaskedSoftmax reuses its buffers (see its docstring)
_SOFTMAX_INPLACE_DEVICES = ('cpu', )


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        warnings.warn(msg, stacklevel=3)


def _constant_bias(terms: Sequence[Tuple[Tensor, bool]],
                   mask: Optional[Tensor]) -> Optional[Tensor]:
    """Sum of constant (no-grad) attention terms and a mask, for SDPA.

    Adds into a full-size buffer this call owns (a fresh contextual term, or
    the first out-of-place sum) in place, so that the (B, H, L, L) bias
    costs one buffer. Head- or batch-broadcast views (bias mode) are made
    compact first, so that a transposed one (iRPE on queries) is read
    contiguously.

    Args:
        terms (list[tuple[Tensor, bool]]): (term, fresh) pairs; ``fresh``
            says the term was computed for this call alone (contextual).
        mask (Tensor, optional): Additive float mask.

    Returns:
        Tensor | None: Broadcastable to (B, H, L, L).
    """
    acc, owned = mask, False
    for term, fresh in terms:
        if not fresh:
            # stride-0 (broadcast) dims back to size 1, then contiguous
            index = tuple(
                slice(0, 1) if st == 0 and sz > 1 else slice(None)
                for st, sz in zip(term.stride(), term.shape))
            term = term[index].contiguous()
        if acc is None:
            acc, owned = term, fresh and term.is_contiguous()
            continue
        shape = torch.broadcast_shapes(acc.shape, term.shape)
        if owned and acc.shape == shape:
            acc.add_(term)
        elif fresh and term.is_contiguous() and term.shape == shape:
            acc, owned = term.add_(acc), True
        else:
            acc, owned = acc + term, True
    return acc


class _MaskedSoftmax(torch.autograd.Function):
    """``softmax(logits + mask)`` over the last dim, in place on CPU.

    On CPU every fresh (B, H, L, L) buffer costs page faults comparable to a
    pass over it, so the logits buffer becomes the probabilities, and in
    backward the incoming gradient buffer becomes the logits' gradient.
    That buffer is produced by this layer's own ``attn @ v`` (and ``rpe_v``)
    backward and is read by no one else. Other devices (whose caching
    allocators make fresh buffers cheap, and where the aliasing of these
    kernels is not tested here) compute out of place.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, mask: Optional[Tensor]) -> Tensor:
        if mask is not None:
            logits.add_(mask)
        ctx.inplace = logits.device.type in _SOFTMAX_INPLACE_DEVICES
        if ctx.inplace:
            torch.ops.aten._softmax.out(logits, -1, False, out=logits)
            ctx.mark_dirty(logits)
            prob = logits
        else:
            prob = torch.softmax(logits, -1)
        ctx.save_for_backward(prob)
        return prob

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Tensor, None]:
        (prob, ) = ctx.saved_tensors
        if (ctx.inplace and grad.is_contiguous()
                and grad.dtype == prob.dtype):
            torch.ops.aten._softmax_backward_data.out(
                grad, prob, -1, prob.dtype, grad_input=grad)
            return grad, None
        return torch._softmax_backward_data(
            grad.to(prob.dtype), prob, -1, prob.dtype), None


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
        attn_impl (str): How attention is computed, one of
            ``'auto'``, ``'explicit'``, ``'flex'``. Defaults to ``'auto'``.

            - ``'explicit'``: logits ``q k^T`` (B, H, L, L) with the iRPE
              terms added in place, softmax in place, ``@ v``. When no
              gradient flows into the iRPE terms and there is no iRPE on
              values (inference, frozen tables, or no RPE at all), the terms
              (and the padding mask) become the float mask of
              ``F.scaled_dot_product_attention``, whose fused kernels are
              faster.
            - ``'flex'``: the fused FlexAttention kernel of
              :func:`~mmpe.models.layers.irpe_flex.irpe_flex_attention`
              (no (L, L) tensor; compiled per grid size).
            - ``'auto'``: ``'flex'`` on CUDA, and on CPU when no backward
              is needed (inference) and the (B, H, L, L) bias it avoids
              would take at least :data:`FLEX_CPU_MIN_BYTES` (1 GiB; on CPU
              the fused kernel saves memory, not time);
              ``'explicit'`` otherwise, and after :data:`MAX_FLEX_KERNELS`
              distinct compiled kernels.

            Either flex setting falls back to ``'explicit'`` (``'flex'``
            with a warning) when the fused path does not apply: iRPE on
            values, an ``attn_mask``, attention dropout while training, no
            iRPE on q / k, FlexAttention unavailable, a backward on CPU
            (PyTorch 2.13 has none), a dtype other than float32 / float16 /
            bfloat16, or a failed compilation (remembered per device type
            and dtype).
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
        if attn_impl not in ATTN_IMPL_CHOICES:
            raise ValueError(f'Unsupported `attn_impl` {attn_impl!r}, please '
                             f'choose from {ATTN_IMPL_CHOICES}')
        self.attn_impl = attn_impl
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
            attn_mask (Tensor, optional): (n_q, n_k) mask, bool (True = not
                allowed) or additive float.
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
        height = width = 0
        if self.rpe_on:
            height, width = self._check_grid(q, k, spatial_shape)
        if key_padding_mask is not None \
                and key_padding_mask.device.type == 'cpu' \
                and not key_padding_mask.any():
            key_padding_mask = None  # nothing padded (no sync on CPU)

        out = None
        if self._use_flex(q, k, v, attn_mask):
            out = self._flex(q, k, v, key_padding_mask, scale, height, width)
        if out is None:
            out = self._explicit(q, k, v, attn_mask, key_padding_mask, scale,
                                 height, width)
        # (bs, heads, n, head_dims) -> (bs, n, dims)
        out = out.transpose(1, 2).flatten(2)
        return self.attn.out_proj(out)

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor,
                  attn_mask: Optional[Tensor],
                  key_padding_mask: Optional[Tensor], scale: float,
                  height: int, width: int) -> Tensor:
        """Eq. 13-17 with (B, H, L, L) logits; (bs, heads, n_q, head_dims).
        """
        drop = self.attn_drop_prob if self.training else 0.0
        terms_need_grad = torch.is_grad_enabled() and any(
            rpe is not None and (rpe.table.requires_grad or (
                rpe.mode == 'contextual' and x.requires_grad))
            for rpe, x in ((self.rpe_k, q), (self.rpe_q, k)))
        if self.rpe_v is None and not terms_need_grad:
            # No gradient into the iRPE terms: they (and the masks) are a
            # constant float mask of SDPA's fused kernels.
            terms = [(rpe(x * scale, height, width), rpe.mode == 'contextual')
                     for rpe, x in ((self.rpe_k, q), (self.rpe_q, k))
                     if rpe is not None]
            bias = _constant_bias(
                terms, self._additive_mask(attn_mask, key_padding_mask, q))
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, dropout_p=drop, scale=scale)

        q = q * scale
        logits = q @ k.transpose(-2, -1)  # (bs, heads, n_q, n_k), fresh
        # the terms go into the logits in place (no (B, H, L, L) temporary)
        if self.rpe_k is not None:
            logits = self.rpe_k(q, height, width, logits=logits)
        if self.rpe_q is not None:
            logits = self.rpe_q(k * scale, height, width, logits=logits)
        mask = self._additive_mask(attn_mask, key_padding_mask, logits)
        attn = _MaskedSoftmax.apply(logits, mask)
        if drop > 0:
            attn = F.dropout(attn, drop, True)
        out = attn @ v  # (bs, heads, n_q, head_dims)
        if self.rpe_v is not None:
            out = out + self.rpe_v(attn, height, width)
        return out

    @staticmethod
    def _additive_mask(attn_mask: Optional[Tensor],
                       key_padding_mask: Optional[Tensor],
                       like: Tensor) -> Optional[Tensor]:
        """One float mask (0 / -inf, plus a float ``attn_mask``) that
        broadcasts to (bs, heads, n_q, n_k), in the dtype of ``like``."""
        mask = None
        if key_padding_mask is not None:
            # (bs, n_k) -> (bs, 1, 1, n_k)
            kpm = key_padding_mask[:, None, None, :].bool()
            mask = torch.zeros(
                kpm.shape, dtype=like.dtype,
                device=like.device).masked_fill_(kpm, float('-inf'))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros(
                    attn_mask.shape, dtype=like.dtype,
                    device=like.device).masked_fill_(attn_mask, float('-inf'))
            attn_mask = attn_mask.to(like.dtype)
            mask = attn_mask if mask is None else mask + attn_mask
        return mask

    # ------------------------------------------------------------------
    # the fused FlexAttention path
    # ------------------------------------------------------------------
    def _flex_reason(self, q: Tensor, k: Tensor, v: Tensor,
                     attn_mask: Optional[Tensor]) -> Optional[str]:
        """Why the fused path does not apply to this call, or None."""
        if self.rpe_k is None and self.rpe_q is None:
            return 'no iRPE on queries or keys'
        if self.rpe_v is not None:
            return 'iRPE on values needs the attention probabilities'
        if attn_mask is not None:
            return '`attn_mask` is not supported'
        if self.training and self.attn_drop_prob > 0:
            return 'attention dropout is not supported'
        if q.dtype not in _FLEX_DTYPES:
            return f'dtype {q.dtype} is not supported'
        if (q.device.type, q.dtype) in _FLEX_FAILED:
            return f'compilation failed before on {q.device.type}'
        requires_grad = torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad or any(
                rpe is not None and rpe.table.requires_grad
                for rpe in (self.rpe_k, self.rpe_q)))
        return flex_unsupported_reason(q.device, requires_grad)

    def _use_flex(self, q: Tensor, k: Tensor, v: Tensor,
                  attn_mask: Optional[Tensor]) -> bool:
        if self.attn_impl == 'explicit':
            return False
        reason = self._flex_reason(q, k, v, attn_mask)
        if reason is not None:
            if self.attn_impl == 'flex':
                _warn_once(f"iRPEMultiheadAttention attn_impl='flex' falls "
                           f'back to the explicit path: {reason}')
            return False
        if self.attn_impl == 'auto' and q.device.type == 'cpu':
            bs, heads, n_q = q.shape[:3]
            size = bs * heads * n_q * k.shape[2] * q.element_size()
            return size >= FLEX_CPU_MIN_BYTES
        return True

    def _flex(self, q: Tensor, k: Tensor, v: Tensor,
              key_padding_mask: Optional[Tensor], scale: float, height: int,
              width: int) -> Optional[Tensor]:
        """The fused path, or None where 'auto' or a failure says explicit.
        """
        key = flex_cache_key(q, height, width, (self.rpe_k, self.rpe_q),
                             key_padding_mask is not None)
        if self.attn_impl == 'auto' and key not in _FLEX_KEYS:
            if len(_FLEX_KEYS) >= MAX_FLEX_KERNELS:
                return None  # do not compile yet another kernel
            _FLEX_KEYS.add(key)
        try:
            return irpe_flex_attention(
                q.contiguous(), k.contiguous(), v.contiguous(), height,
                width, self.rpe_k, self.rpe_q, key_padding_mask, scale)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # compilation (no compiler, inductor bug)
            _FLEX_FAILED.add((q.device.type, q.dtype))
            _warn_once('iRPEMultiheadAttention: FlexAttention failed on '
                       f'{q.device.type} ({type(e).__name__}: '
                       f'{str(e)[:200]}); using the explicit path')
            return None

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
