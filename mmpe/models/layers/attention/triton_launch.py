"""The launches of the fused Triton kernels: arguments, grids, tile sizes.

One function per pass builds everything a kernel launch needs from the
custom op's inputs (:mod:`.fused_triton`) as :class:`Launch` values: the
op launches them, and ``tools/analysis/kernel_report.py`` compiles the very
same launches for a GPU target (``kernel.run(..., warmup=True)``) without
running them, so the report describes the code the op runs.

Tile sizes, warps and software-pipelining stages come from
:data:`TILE_CONFIGS` by pass, head dim and the gradient scatters per pair,
read against the compile report (registers, spills, instructions per
tile): four warps; 64 keys per tile at head dim 64, 32 at head dim 32
(DETR's heads: with 64 Triton keeps the gathers' addresses per pair and
the kernels spill); three stages for the forward, one for the backward
kernels, whose four products per tile and recomputed terms need the
registers that software pipelining would take (two stages: 241 registers
at head dim 64 without a term, and spills with one); half tiles (32 query
rows or keys) for a backward pass that accumulates a term's bucket sums
while it recomputes another (q and k), or two per pair (cross), which
spill at full tiles.
"""
import math
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

#: The oldest Triton release the kernels take (``tl.philox`` with two
#: counters, relaxed atomics, the launch options used here)
TRITON_MIN = (3, 6)

try:
    import triton

    from . import triton_kernels as _kernels
    TRITON_IMPORT_ERROR: Optional[str] = None
    if tuple(int(x) for x in triton.__version__.split('.')[:2]) < TRITON_MIN:
        TRITON_IMPORT_ERROR = (
            f'Triton {triton.__version__} is older than '
            f'{".".join(map(str, TRITON_MIN))}, the oldest release the '
            f'kernels take')
except ImportError as e:  # no Triton (a CPU-only install without tests)
    triton = _kernels = None
    TRITON_IMPORT_ERROR = f'Triton is not installed ({e})'

#: The keys of a tile of skip (class) tokens: the smallest ``tl.dot`` width
SKIP_TILE = 16
#: The most skip tokens a call may have (they fit one skip tile)
MAX_SKIP = SKIP_TILE
#: Grid rows a key tile may span above which the row part of a bucket is
#: gathered per pair instead of selected from per-row candidates (grids
#: narrower than about 8 tokens)
MAX_CANDIDATE_ROWS = 8


class TileConfig(NamedTuple):
    """Query rows ``BM`` and keys ``BN`` per tile, warps and stages."""

    BM: int
    BN: int
    num_warps: int
    num_stages: int


#: ``pass -> ((largest head dim, most scatters per pair), TileConfig)``,
#: the first entry that takes the call's head dim and the number of
#: gradient scatters per pair of that pass (the term whose bucket sums it
#: accumulates: 1 product, 2 cross; backward_kv: the term on queries,
#: backward_q: the term on keys); measured by the compile report
TILE_CONFIGS: Dict[str, Tuple[Tuple[Tuple[int, int], TileConfig], ...]] = {
    'forward': (((32, 2), TileConfig(64, 32, 4, 3)),
                ((64, 2), TileConfig(64, 64, 4, 3)),
                ((256, 2), TileConfig(64, 32, 4, 2))),
    'backward_kv': (((32, 0), TileConfig(64, 32, 4, 1)),
                    ((32, 2), TileConfig(32, 32, 4, 1)),
                    ((64, 0), TileConfig(64, 64, 4, 1)),
                    ((64, 2), TileConfig(32, 64, 4, 1)),
                    ((256, 2), TileConfig(32, 32, 4, 1))),
    'backward_q': (((32, 2), TileConfig(64, 32, 4, 1)),
                   ((64, 1), TileConfig(64, 64, 4, 1)),
                   ((64, 2), TileConfig(64, 32, 4, 1)),
                   ((256, 2), TileConfig(64, 32, 4, 1))),
}


def tile_config(kernel: str, head_dim: int, scatters: int = 0) -> TileConfig:
    """The tile sizes of ``kernel`` ('forward', 'backward_kv',
    'backward_q') for a head dim (the larger of q's and v's) and the
    gradient scatters per pair it makes (:data:`TILE_CONFIGS`)."""
    for (largest, most), config in TILE_CONFIGS[kernel]:
        if head_dim <= largest and scatters <= most:
            return config
    raise ValueError(f'head dim {head_dim} is above the largest the '
                     f'kernels take ({TILE_CONFIGS[kernel][-1][0][0]})')


class Launch(NamedTuple):
    """One kernel launch: ``kernel[grid](*args, **meta)``."""

    name: str
    kernel: object
    grid: Tuple[int, int]
    args: tuple
    meta: dict

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.meta)


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _strides3(x: Optional[Tensor]) -> Tuple[int, int, int]:
    return (0, 0, 0) if x is None else tuple(x.stride()[:3])


def rows_view(x: Optional[Tensor], b: int, h: int,
              length: int) -> Optional[Tensor]:
    """Term values as the kernels read them: a (B, H, length, nb) view of
    their broadcast form, last dim contiguous; a dim of size 1 (the
    batch, the rows of a bias table) stays a stride-0 view."""
    if x is None:
        return None
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.reshape((1, ) * (4 - x.dim()) + tuple(x.shape)).expand(
        b, h, length, x.shape[-1])


def shared_rows(values: Optional[Tensor]) -> bool:
    """Whether term values (:func:`rows_view`) are the same for every
    viewer (stride 0 along the rows: a bias table, the offset biases):
    their gradient then has one row per program's block of viewers, not
    one per viewer."""
    return values is not None and values.shape[2] > 1 and \
        values.stride(2) == 0


def grad_rows(values: Optional[Tensor], length: int, block: int) -> int:
    """Rows of the float32 gradient of term values seen by ``length``
    viewers in programs of ``block``: one per program's block where the
    values are shared (:func:`shared_rows`), else one per viewer (the
    launch adds a scratch row where its kernel needs one)."""
    return triton.cdiv(length, block) if shared_rows(values) else length


def bucket_tables(rows: Tensor, cols: Tensor,
                  layout: List[int]) -> Tuple[Tensor, Tensor]:
    """The kernels' int32 tables: ``(h + 1, h + 1)`` row parts and ``(w +
    1, w + 1)`` column parts of the pairs' buckets, so that a pair's bucket
    is ``part1 + part2`` (product: ``rows * Sx`` and ``cols``) or the two
    buckets ``part1``, ``part2`` (cross: ``rows`` and ``offset + cols``);
    the extra row and column hold the skip tokens' bucket(s) (product:
    ``E0`` and 0, cross: ``E0`` and ``E1``)."""
    product, _, sx, offset, skip, e0, e1, _ = layout
    if product and e1 >= 0:
        raise ValueError(f'a product layout has one extra bucket, got '
                         f'extras ({e0}, {e1})')
    h, w = rows.shape[1], cols.shape[1]
    first = e0 if skip else 0
    second = (0 if product else e1) if skip else 0
    r = torch.full((h + 1, h + 1), first, dtype=torch.int32,
                   device=rows.device)
    c = torch.full((w + 1, w + 1), second, dtype=torch.int32,
                   device=cols.device)
    r[:rows.shape[0], :h] = rows * sx if product else rows
    c[:cols.shape[0], :w] = cols if product else cols + offset
    return r, c


def rows_spanned(width: int, block: int, aligned: bool) -> int:
    """The most grid rows a tile of ``block`` consecutive grid tokens spans
    on a grid ``width`` wide: tiles starting at multiples of ``block``
    (``aligned``: their first column is a multiple of ``gcd(block,
    width)``, so a tile of a grid whose width ``block`` divides stays in
    one row), else anywhere."""
    last = width - math.gcd(block, width) if aligned else width - 1
    return (last + block - 1) // width + 1


def _flags(q: Tensor, mask: Optional[Tensor], values_k, values_q,
           with_sums: bool, layout: List[int], dropout_p: float,
           interpreted: bool, block_n: int, width: int,
           aligned: bool = True) -> dict:
    """The kernels' constexpr switches (one compilation per combination).
    ``IEEE``: float32 products (float32 inputs, as the explicit backend's:
    no TF32; and bfloat16 in the interpreter, whose bfloat16 ``tl.dot``
    returns garbage as of Triton 3.9: the operands are converted exactly,
    only the rounding of ``P`` before ``P V`` differs from the GPU's).
    ``MASK``: 0 none, 1 one row of keys for every query (padding), 2 per
    pair. ``ROWS``: grid rows a tile of ``block_n`` grid keys spans
    (:func:`rows_spanned`; ``aligned``: the tiles start at multiples of
    ``block_n`` grid keys)."""
    ieee = q.dtype == torch.float32 or (q.dtype == torch.bfloat16
                                        and interpreted)
    skip = layout[4]
    rows = rows_spanned(width, block_n, aligned)
    if skip > MAX_SKIP:
        raise ValueError(f'the Triton kernel takes at most {MAX_SKIP} skip '
                         f'tokens, got {skip}')
    return dict(SKIP=skip,
                ROWS=rows if rows <= MAX_CANDIDATE_ROWS else 0,
                MASK=0 if mask is None else 1 if mask.stride(2) == 0 else 2,
                HAS_K=values_k is not None, HAS_Q=values_q is not None,
                WITH_SUMS=with_sums, PRODUCT=bool(layout[0]),
                QGRID=bool(layout[7]), IEEE=ieee,
                HAS_DROPOUT=dropout_p > 0)


#: The kernels address a head's rows with int32 offsets (row x row stride +
#: column): every such offset stays below this
INT32_LIMIT = 2**31


def check_offsets(**tensors: Optional[Tensor]) -> None:
    """Refuse tensors whose per-head offsets pass :data:`INT32_LIMIT`
    (e.g. values of ``L`` tokens x ``nb`` buckets with ``L * nb >= 2^31``;
    the mask's offsets are 64-bit, and the dropout's counters are the pair's
    two token indices, not their product).

    Raises:
        ValueError: naming the tensor, its shape and the limit.
    """
    for name, x in tensors.items():
        if x is None or x.dim() != 4:
            continue
        last = sum((n - 1) * st for n, st in zip(x.shape[2:], x.stride()[2:]))
        if last >= INT32_LIMIT:
            raise ValueError(
                f'{name} of shape {tuple(x.shape)} has per-head offsets up '
                f'to {last}: the Triton kernel takes fewer than 2^31 '
                f'elements per head (e.g. tokens x buckets); split the '
                f'batch or the sequence, or use attn_impl="chunked"')


def _mask_strides(mask: Optional[Tensor]) -> tuple:
    return (0, ) * 4 if mask is None else tuple(mask.stride())


def _scatters(name: str, term: Optional[Tensor], layout: List[int],
              head_dim: int, width: int) -> int:
    """Atomic adds per pair of a backward pass: 0 without the term whose
    bucket sums it accumulates, 1 for a product, 2 for a cross term, but 1
    for backward_q's cross term on keys where its tiles span one or two
    grid rows (the row part's sums are then made per query row,
    ``triton_tiles.scatter_rows``)."""
    if term is None:
        return 0
    if layout[0]:
        return 1
    if name == 'backward_q':
        block = tile_config(name, head_dim, 1).BN
        if rows_spanned(width, block, True) <= 2:
            return 1
    return 2


def forward_launch(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
                   values_k: Optional[Tensor], values_q: Optional[Tensor],
                   with_sums: bool, num_buckets: int, rows: Tensor,
                   cols: Tensor, layout: List[int], seed: int,
                   dropout_p: float,
                   interpreted: bool) -> Tuple[Launch, Tensor, Tensor, Tensor]:
    """The forward's launch and its outputs ``(out, lse, sums)``
    (allocated, written by the launch)."""
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    values_k = rows_view(values_k, b, h, lq)
    values_q = rows_view(values_q, b, h, lk)
    check_offsets(q=q, k=k, v=v, values_k=values_k, values_q=values_q)
    cfg = tile_config('forward', max(d, dv))
    out = q.new_empty(b, h, lq, dv)
    lse = torch.empty(b, h, lq, device=q.device, dtype=torch.float32)
    sums = (torch.zeros(b, h, lq, num_buckets, device=q.device,
                        dtype=torch.float32) if with_sums else
            q.new_empty((0, )))
    table_r, table_c = bucket_tables(rows, cols, layout)
    dummy = lse  # a pointer for absent inputs (never read)
    args = (q, k, v, out, lse, dummy if mask is None else mask,
            dummy if values_k is None else values_k,
            dummy if values_q is None else values_q,
            sums if with_sums else dummy, table_r, table_c,
            *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(out),
            *_mask_strides(mask), *_strides3(values_k),
            *_strides3(values_q), *_strides3(sums if with_sums else None),
            h, lq, lk, cols.shape[1], rows.shape[1], seed, float(dropout_p))
    meta = dict(D=d, DV=dv, **_flags(q, mask, values_k, values_q, with_sums,
                                     layout, dropout_p, interpreted, cfg.BN,
                                     cols.shape[1]),
                BM=cfg.BM, BN=cfg.BN, BD=_pow2(d), BDV=_pow2(dv),
                BSK=SKIP_TILE, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages)
    grid = (triton.cdiv(lq, cfg.BM), b * h)
    return (Launch('forward', _kernels.fused_forward_kernel, grid, args,
                   meta), out, lse, sums)


def backward_launches(grad_out: Tensor, grad_sums: Optional[Tensor],
                      q: Tensor, k: Tensor, v: Tensor, delta: Tensor,
                      lse: Tensor, mask: Optional[Tensor],
                      values_k: Optional[Tensor], values_q: Optional[Tensor],
                      rows: Tensor, cols: Tensor, layout: List[int],
                      seed: int, dropout_p: float,
                      interpreted: bool) -> Tuple[List[Launch], list]:
    """The backward's two launches and their outputs ``[dq, dk, dv, dvk,
    dvq]`` (``dvk`` / ``dvq``: float32 bucket sums, None without that
    term)."""
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    values_k = rows_view(values_k, b, h, lq)
    values_q = rows_view(values_q, b, h, lk)
    check_offsets(grad_out=grad_out, grad_sums=grad_sums)
    dq, dk, dv_ = (torch.empty_like(x) for x in (q, k, v))
    cfgs = {
        name: tile_config(name, max(d, dv),
                          _scatters(name, term, layout, max(d, dv),
                                    cols.shape[1]))
        for name, term in (('backward_kv', values_q), ('backward_q',
                                                       values_k))
    }
    # the values' gradients, float32: a row per viewer, or per program's
    # block of viewers where the values are shared (grad_rows); for the
    # term on queries a scratch row past them, where backward_kv's keys
    # past LK (its last block) put their bucket sums
    dvk = (None if values_k is None else torch.zeros(
        b, h, grad_rows(values_k, lq, cfgs['backward_q'].BM),
        values_k.shape[-1], device=q.device, dtype=torch.float32))
    dvq = (None if values_q is None else torch.zeros(
        b, h, grad_rows(values_q, lk, cfgs['backward_kv'].BN) + 1,
        values_q.shape[-1], device=q.device, dtype=torch.float32))
    table_r, table_c = bucket_tables(rows, cols, layout)
    dummy = lse
    common = (dummy if mask is None else mask,
              dummy if values_k is None else values_k,
              dummy if values_q is None else values_q,
              dummy if grad_sums is None else grad_sums)
    strides = (*_strides3(q), *_strides3(k), *_strides3(v),
               *_strides3(grad_out), *_mask_strides(mask),
               *_strides3(values_k), *_strides3(values_q),
               *_strides3(grad_sums))
    sizes = (h, lq, lk, cols.shape[1], rows.shape[1], seed, float(dropout_p))
    launches = []
    for name, kernel in (('backward_kv', _kernels.fused_backward_kv_kernel),
                         ('backward_q', _kernels.fused_backward_q_kernel)):
        cfg = cfgs[name]
        # the key blocks of backward_kv start at multiples of BN tokens,
        # skip tokens included; the forward's and backward_q's key tiles at
        # multiples of BN grid keys
        meta = dict(D=d, DVD=dv,
                    **_flags(q, mask, values_k, values_q,
                             grad_sums is not None, layout, dropout_p,
                             interpreted, cfg.BN, cols.shape[1],
                             name == 'backward_q' or layout[4] == 0),
                    BM=cfg.BM, BN=cfg.BN, BD=_pow2(d), BDV=_pow2(dv),
                    BSK=SKIP_TILE, num_warps=cfg.num_warps,
                    num_stages=cfg.num_stages)
        if name == 'backward_kv':
            qrows = rows_spanned(cols.shape[1], cfg.BM, layout[4] == 0)
            meta['QROWS'] = qrows if qrows <= MAX_CANDIDATE_ROWS else 0
            outs = (dk, dv_, dummy if dvq is None else dvq)
            out_strides = (*_strides3(dk), *_strides3(dv_), *_strides3(dvq))
            grid = (triton.cdiv(lk, cfg.BN), b * h)
        else:
            outs = (dq, dummy if dvk is None else dvk)
            out_strides = (*_strides3(dq), *_strides3(dvk))
            grid = (triton.cdiv(lq, cfg.BM), b * h)
        args = (q, k, v, grad_out, lse, delta, *common, *outs, table_r,
                table_c, *strides, *out_strides, *sizes)
        launches.append(Launch(name, kernel, grid, args, meta))
    return launches, [dq, dk, dv_, dvk,
                      None if dvq is None else dvq[:, :, :-1]]


def dropout_mask_launch(out: Tensor, seed: int, dropout_p: float, heads: int,
                        queries: int, keys: int) -> Launch:
    """The launch that writes the dropout scale the kernels draw into
    ``out`` (B * H, Q, L)."""
    cfg = tile_config('forward', 16)
    return Launch('dropout_mask', _kernels.dropout_mask_kernel,
                  (triton.cdiv(queries, cfg.BM), out.shape[0]),
                  (out, seed, float(dropout_p), heads, queries, keys),
                  dict(BM=cfg.BM, BN=cfg.BN))
