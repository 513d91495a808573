"""Fused iRPE attention on PyTorch FlexAttention, without an (L, L) tensor.

Computes the attention of Eq. 13-16 of `Rethinking and Improving Relative
Position Encoding for Vision Transformer <https://arxiv.org/abs/2107.14222>`_
(Wu et al., ICCV 2021) with iRPE on keys and/or queries (bias or contextual)
in one FlexAttention kernel: a ``score_mod`` adds the per-query lookup of
Eq. 27-28 to every logit as the kernel produces it,

.. math::

    e_{ij} \\mathrel{+}= \\mathrm{lut}^K[b, h, i, \\beta(i, j)] +
    \\mathrm{lut}^Q[b, h, j, \\beta(j, i)], \\quad
    \\mathrm{lut}^K = (q / \\sqrt{d}) R^{K\\top}, \\;
    \\mathrm{lut}^Q = (k / \\sqrt{d}) R^{Q\\top}

(bias mode: the lookup is the table itself). The bucket ``beta(i, j)`` is not
read from an (L, L) id map but recomputed in the kernel from the query and
key coordinates and the small per-axis tables of
:mod:`~mmpe.models.layers.irpe.index` (rows and columns, or the distance
table, of a square grid of the call's size bucket), so nothing of size
``L x L`` is
stored: on CUDA neither forward nor backward, on CPU the forward (PyTorch
2.13 refuses FlexAttention's backward on CPU). Padded keys are masked in the
``score_mod``.

iRPE on values needs the attention probabilities themselves and is not
supported here; :class:`~mmpe.models.layers.PEMultiheadAttention` falls
back to its explicit path for it (see its ``attn_impl``).

Compilation: FlexAttention is only fused when compiled
(``torch.compile(flex_attention)``; on CPU inductor emits C++ and needs a
C++ compiler). Shapes are compiled statically (``dynamic=False``) and padded
to a few size buckets (:mod:`~mmpe.models.layers.attention.flex_shapes`): a new
(batch, bucket, dtype) costs one compilation (seconds on CPU), a new grid
inside a bucket none.
"""
import functools
import inspect
import math
from typing import Callable, Dict, Optional

import torch
from torch import Tensor

from ..common.cache import BoundedCache
from ..irpe.buckets import axis_bucket_tables
from ..irpe.index import max_index, num_buckets_per_table
from ..irpe.irpe import iRPE
from .flex_shapes import (FLEX_RECOMPILE_LIMIT, pad_tokens, padded_key_mask,
                          padded_length, table_side, tail_block_mask)

try:  # FlexAttention appeared in PyTorch 2.5
    from torch.nn.attention.flex_attention import \
        flex_attention as _flex_attention
    FLEX_AVAILABLE = True
except ImportError:  # pragma: no cover - old PyTorch
    _flex_attention = None
    FLEX_AVAILABLE = False

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]

#: dtypes FlexAttention compiles for (PyTorch 2.13)
FLEX_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Per-axis index tables of a square grid (int32, as the kernel reads
# them), keyed by the iRPE config, side and device.
_TABLE_CACHE = BoundedCache(32)


@functools.lru_cache(maxsize=1)
def compiled_flex_attention() -> Callable:
    """``torch.compile(flex_attention, dynamic=False, fullgraph=True)``,
    made on first use.

    The one registry of compiled kernels: this wrapper, built once (building
    it imports dynamo, seconds, so not at import); dynamo keeps one kernel
    per (shapes, dtype, score_mod code), counted apart from other compiled
    regions (``isolate_recompiles``); past
    :data:`~.flex_shapes.FLEX_RECOMPILE_LIMIT` kernels a
    call raises instead of running FlexAttention uncompiled.

    A PyTorch whose ``torch.compile`` lacks these two arguments (2.11 has
    neither; the CUDA builds users bring may be older than the stack's
    2.13) compiles the same wrapper under dynamo's own limit
    (``torch._dynamo.config.recompile_limit``, 8 by default, counted per
    code object): past it a ``fullgraph`` call raises there too.
    """
    if not FLEX_AVAILABLE:
        raise RuntimeError('FlexAttention is not available in PyTorch '
                           f'{torch.__version__}')
    return torch.compile(_flex_attention, dynamic=False, fullgraph=True,
                         **_recompile_options())


def _recompile_options() -> Dict[str, object]:
    """``torch.compile``'s per-wrapper recompile limit, where this PyTorch
    has the arguments (read once, off the hot path)."""
    params = inspect.signature(torch.compile).parameters
    if 'recompile_limit' in params and 'isolate_recompiles' in params:
        return dict(recompile_limit=FLEX_RECOMPILE_LIMIT,
                    isolate_recompiles=True)
    return {}


def flex_unsupported_reason(device: torch.device,
                            requires_grad: bool) -> Optional[str]:
    """Why the fused path cannot run here, or None if it can.

    Args:
        device (torch.device): Device of the inputs.
        requires_grad (bool): Whether a backward pass will be needed.

    Returns:
        str | None: A short reason, or None.
    """
    if not FLEX_AVAILABLE:
        return f'FlexAttention is not available in PyTorch {torch.__version__}'
    if device.type == 'cpu' and requires_grad:
        return ('FlexAttention has no backward on CPU (PyTorch '
                f'{torch.__version__})')
    if device.type not in ('cpu', 'cuda'):
        return f'FlexAttention does not support device {device.type!r}'
    return None


def _index_tables(rpe: iRPE, side: int,
                  device: torch.device) -> Dict[str, Tensor]:
    """:func:`~mmpe.models.layers.irpe.buckets.axis_bucket_tables` of ``rpe``
    on a ``side x side`` grid, as int32 (cached). Entries depend on cell
    offsets only, so they serve every grid up to that size."""
    key = (rpe.bucket_spec, side, device)

    def build() -> Dict[str, Tensor]:
        tables = axis_bucket_tables(side, side, rpe.bucket_spec, device)
        return {name: t.int() for name, t in tables.items()}

    return _TABLE_CACHE.get(key, build)


def _term_fn(rpe: iRPE, lut: Tensor, grid: Dict[str, Tensor],
             side: int) -> Callable[..., Tensor]:
    """The iRPE term of one (viewer, other) token pair, for a score_mod.

    Args:
        rpe (iRPE): The module (its config and, for bias, its table).
        lut (Tensor): Contextual: (B, H, L, num_buckets), the lookup of every
            viewer token; bias: (H', num_buckets), the table.
        grid (dict[str, Tensor]): 0-d int32 ``width`` and ``last`` (cells
            minus one) of the grid: values, so that a new grid inside a
            size bucket compiles nothing.
        side (int): Side of the index tables (>= height and width).

    Returns:
        callable: ``f(b, h, p, r)`` of int32 scalars, the term of viewer
        token ``p`` and other token ``r``: ``lut[b, h, p, bucket(p, r)]``.
        On keys the viewer is the query, on queries it is the key. Tokens
        past the grid (padding) read the last cell's buckets.
    """
    tabs = _index_tables(rpe, side, lut.device)
    width, last = grid['width'], grid['last']
    side = 2 * max_index(rpe.bucket_spec) + 1
    per = num_buckets_per_table(rpe.bucket_spec, rpe.skip)
    skip, method = rpe.skip, rpe.method
    contextual, shared = rpe.mode == 'contextual', rpe.shared_head

    def read(b, h, p, bucket):
        if contextual:
            return lut[b, h, p, bucket]
        return lut[0 if shared else h, bucket]

    def spatial(b, h, p, r):
        # skip tokens and padding get clamped (valid) coordinates: the
        # extra bucket below replaces the former, the key mask / the
        # dropped output rows the latter
        p_s = torch.minimum(torch.clamp(p - skip, min=0), last)
        r_s = torch.minimum(torch.clamp(r - skip, min=0), last)
        py, px = p_s // width, p_s % width
        ry, rx = r_s // width, r_s % width
        if method == 'product':
            return read(b, h, p, tabs['rows'][py, ry] * side +
                        tabs['cols'][px, rx])
        if method == 'cross':
            return (read(b, h, p, tabs['rows'][py, ry]) +
                    read(b, h, p, tabs['cols'][px, rx] + per))
        return read(b, h, p, tabs['dist'][torch.abs(py - ry),
                                          torch.abs(px - rx)])

    if not skip:
        return spatial

    def with_skip(b, h, p, r):
        value = spatial(b, h, p, r)
        # the extra bucket as a tensor index (a Python int index does not
        # trace inside a score_mod)
        last = torch.zeros_like(p) + (per - 1)
        extra = read(b, h, p, last)
        if method == 'cross':
            extra = extra + read(b, h, p, last + per)
        return torch.where((p < skip) | (r < skip), extra, value)

    return with_skip


def _lookup(rpe: iRPE, x: Tensor) -> Tensor:
    """Eq. 27's lookup: contextual ``x @ table^T`` (B, H, L, nb); bias: the
    table (H', nb). ``x`` is already scaled."""
    if rpe.mode == 'bias':
        return rpe.table.to(x.dtype)
    return rpe.lookup(x)


def irpe_score_mod(grid: Dict[str, Tensor],
                   side: int,
                   rpe_k: Optional[iRPE] = None,
                   lut_k: Optional[Tensor] = None,
                   rpe_q: Optional[iRPE] = None,
                   lut_q: Optional[Tensor] = None,
                   key_padding_mask: Optional[Tensor] = None) -> ScoreMod:
    """Build the FlexAttention ``score_mod`` adding the iRPE terms.

    Args:
        grid (dict[str, Tensor]): 0-d int32 ``width`` and ``last`` (cells
            minus one) of the token grid.
        side (int): Side of the index tables (>= the grid's sides).
        rpe_k (iRPE, optional): iRPE on keys (``on='k'``).
        lut_k (Tensor, optional): Its lookup: contextual (B, H, L, nb) from
            the scaled queries, bias its table (H', nb).
        rpe_q (iRPE, optional): iRPE on queries (``on='q'``).
        lut_q (Tensor, optional): Its lookup: contextual (B, H, L, nb) from
            the scaled keys, bias its table.
        key_padding_mask (Tensor, optional): (B, L) bool, True at padded
            keys, which get ``-inf``.

    Returns:
        callable: ``score_mod(score, b, h, q_idx, kv_idx)``.
    """
    term_k = None if rpe_k is None else _term_fn(rpe_k, lut_k, grid, side)
    term_q = None if rpe_q is None else _term_fn(rpe_q, lut_q, grid, side)

    def score_mod(score, b, h, q_idx, kv_idx):
        if term_k is not None:
            score = score + term_k(b, h, q_idx, kv_idx)
        if term_q is not None:
            # r^Q seen from the key: bucket of (key j, query i)
            score = score + term_q(b, h, kv_idx, q_idx)
        if key_padding_mask is not None:
            score = torch.where(key_padding_mask[b, kv_idx],
                                score.new_tensor(float('-inf')), score)
        return score

    return score_mod


def irpe_flex_attention(query: Tensor,
                        key: Tensor,
                        value: Tensor,
                        height: int,
                        width: int,
                        rpe_k: Optional[iRPE] = None,
                        rpe_q: Optional[iRPE] = None,
                        key_padding_mask: Optional[Tensor] = None,
                        scale: Optional[float] = None,
                        compiled: bool = True) -> Tensor:
    """Attention with iRPE on keys / queries in one FlexAttention kernel.

    Equals :meth:`PEMultiheadAttention.attention` before the output
    projection (softmax of ``q k^T / sqrt(d)`` plus the iRPE terms, with
    the queries scaled before they meet ``r^K`` and the keys before
    ``r^Q``, as in the authors' release), without dropout.

    Args:
        query (Tensor): (B, H, L, head_dim), not scaled.
        key (Tensor): (B, H, L, head_dim).
        value (Tensor): (B, H, L, head_dim).
        height (int): Grid height; ``L = skip + height * width``.
        width (int): Grid width.
        rpe_k (iRPE, optional): iRPE on keys.
        rpe_q (iRPE, optional): iRPE on queries.
        key_padding_mask (Tensor, optional): (B, L) bool, True at padding.
        scale (float, optional): Logit scale; defaults to
            ``1 / sqrt(head_dim)``.
        compiled (bool): Use the compiled (fused) kernel. False runs
            FlexAttention eagerly, which materialises the scores and is
            only meant for checking the ``score_mod``. Defaults to True.

    Returns:
        Tensor: (B, H, L, head_dim).
    """
    if not FLEX_AVAILABLE:
        raise RuntimeError('FlexAttention is not available in PyTorch '
                           f'{torch.__version__}')
    for name, rpe in (('rpe_k', rpe_k), ('rpe_q', rpe_q)):
        if rpe is not None and rpe.on != name[-1]:
            raise ValueError(f'`{name}` must be an iRPE with on='
                             f'{name[-1]!r}, got on={rpe.on!r}')
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    # the size bucket (flex_shapes.py): padded tokens, masked keys
    batch, length, device = query.shape[0], query.shape[2], query.device
    padded = padded_length(length)
    query, key, value = (pad_tokens(x, padded) for x in (query, key, value))
    lut_k = None if rpe_k is None else _lookup(rpe_k, query * scale)
    lut_q = None if rpe_q is None else _lookup(rpe_q, key * scale)
    mask = padded_key_mask(key_padding_mask, batch, length, padded, device)
    grid = dict(width=torch.tensor(width, dtype=torch.int32, device=device),
                last=torch.tensor(height * width - 1, dtype=torch.int32,
                                  device=device))
    score_mod = irpe_score_mod(grid, table_side(height, width, padded),
                               rpe_k, lut_k, rpe_q, lut_q, mask)
    fn = compiled_flex_attention() if compiled else _flex_attention
    out = fn(query, key, value, score_mod=score_mod, scale=scale,
             block_mask=tail_block_mask(length, padded, device))
    return out[:, :, :length]  # padded queries dropped
