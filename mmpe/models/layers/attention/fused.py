"""Exact attention with a per-axis relative term in one CPU kernel.

For scaled queries, keys and values (B, H, L, d) of an ``h x w`` grid and a
logit term given as per-query values over per-axis buckets
(:class:`~mmpe.models.layers.terms.relative_term.AxisValues`: iRPE's product
and cross methods on keys, Wu et al. ICCV 2021, Eq. 16 with the lookup of
Eq. 27; ViTDet's decomposed relative position), it computes

.. math::

    e_{ij} = q_i k_j^T + T_{ij} + m_{ij}, \\quad
    o_i = \\sum_j \\mathrm{softmax}_j(e_{ij}) v_j

as mmpe's C++ kernel ``mmpe/csrc/fused_attention_cpu.cpp`` does it: one
block of query rows at a time, sized to stay in the core's cache, with
the logits, the term (read from the per-query values by the per-axis bucket
tables), the mask and the softmax in one pass and the products through
ATen's matrix multiply. The forward saves the output and each row's
log-sum-exp; the backward recomputes each block's probabilities from them
and returns ``dq``, ``dk``, ``dv`` and the values' gradient (the bucket sums
of ``dE = P * (dP - rowsum(dO * O))``), from which autograd reaches the
tables and the queries the lookups read. No ``(L, L)`` tensor exists in
either pass: the memory of fused attention, and its time up to the term.

It is the CPU counterpart of FlexAttention (:mod:`.flex`): the same
function as the explicit and chunked backends for the terms it reads,
nothing else. The pair is registered as the ``torch.library`` custom ops
``mmpe::fused_attention`` / ``mmpe::fused_attention_backward`` (fake
kernels, autograd registration), so compiled graphs call it as one node.
The kernel is compiled when mmpe is installed (``setup.py``, as mmcv's
ops); without it (:func:`fused_unavailable_reason`) the attention core
runs its other backends. Its row loops are compiled for several
instruction sets (:data:`KERNEL_ISAS`); each process runs the widest its
CPU has (:func:`kernel_isa`, logged once), or the one ``MMPE_KERNEL_ISA``
names, so one build serves every x86-64 CPU. bfloat16 and float16 inputs
(CPU autocast) are computed in float32 (logits, softmax statistics, every
sum), with the output and the gradients of q, k, v in their dtype.
"""
import functools
import os
from typing import List, Optional, Sequence, Tuple

import torch
from mmengine.logging import print_log
from torch import Tensor

from ..terms.relative_term import AxisValues

try:
    from mmpe import _ext  # the compiled kernel (setup.py)
    _EXT_ERROR: Optional[str] = None
except ImportError as e:  # not built (no compiler at install time)
    _ext = None
    _EXT_ERROR = f'the compiled kernel mmpe._ext is not built ({e})'

#: dtypes of q, k, v the kernel takes (float32 exp is vectorised; float64
#: for the tests' tight comparisons; bfloat16 / float16, e.g. under CPU
#: autocast, are computed in float32: see :func:`compute_dtype`)
FUSED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
#: Elements of one block of query rows against all keys (R * L): two such
#: blocks per thread stay in a 1-2 MB L2 cache (float32) ...
BLOCK_ELEMENTS = 2**16
#: ... but never fewer query rows than this: the block's matrix products
#: lose efficiency below (8 rows at 8192 tokens took 1.36x the time of 32,
#: measured on CPU; 16 to 64 rows were within 5 % of each other at 4096)
MIN_BLOCK_ROWS = 32


#: The row loops' variants, narrowest first: any CPU (x86-64: SSE2),
#: AVX2 + FMA, AVX-512 F/BW/VL/DQ (mmpe/csrc/kernel_rows_*.cpp; the last
#: two on x86-64 builds only)
KERNEL_ISAS = ('baseline', 'avx2', 'avx512')
#: The environment variable that forces a variant
KERNEL_ISA_ENV = 'MMPE_KERNEL_ISA'


def fused_unavailable_reason() -> Optional[str]:
    """Why the fused kernel cannot run in this installation, or None."""
    return _EXT_ERROR


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernel computes in for q, k, v of ``dtype``: float32
    for bfloat16 and float16 (the logits, the softmax statistics and every
    accumulation; the mask and the term values are passed in it), else
    ``dtype``. Outputs and the gradients of q, k, v are in ``dtype``."""
    return (torch.float32 if dtype in (torch.bfloat16, torch.float16) else
            dtype)


def runnable_kernel_isas() -> Tuple[str, ...]:
    """The kernel variants this build has and this CPU runs (cpuid and the
    OS's support of the registers), narrowest first; empty without the
    kernel."""
    return () if _ext is None else tuple(_ext.runnable_isas())


def choose_kernel_isa(requested: Optional[str],
                      runnable: Sequence[str]) -> str:
    """The variant to run: ``requested`` (a name of :data:`KERNEL_ISAS`)
    or, when it is None or empty, the last (widest) of ``runnable``.

    Raises:
        ValueError: ``requested`` is not a variant's name.
        RuntimeError: This CPU (or build) cannot run ``requested``.
    """
    if not requested:
        return runnable[-1]
    if requested not in KERNEL_ISAS:
        raise ValueError(f'{KERNEL_ISA_ENV}={requested!r} is not a kernel '
                         f'variant; choose one of {", ".join(KERNEL_ISAS)}')
    if requested not in runnable:
        raise RuntimeError(
            f'{KERNEL_ISA_ENV}={requested!r}: this CPU (or this build of '
            f'mmpe._ext) cannot run that kernel variant; it runs '
            f'{", ".join(runnable)}')
    return requested


@functools.lru_cache(maxsize=None)
def kernel_isa() -> str:
    """The kernel variant this process runs: ``$MMPE_KERNEL_ISA`` if set,
    else the widest this CPU runs (:func:`choose_kernel_isa`). Chosen at the
    first call and logged once (MMEngine's current logger)."""
    if _ext is None:
        raise RuntimeError(_EXT_ERROR)
    runnable = runnable_kernel_isas()
    requested = os.environ.get(KERNEL_ISA_ENV, '').strip()
    isa = choose_kernel_isa(requested, runnable)
    how = (f'{KERNEL_ISA_ENV}={requested}' if requested else
           f'the widest of {", ".join(runnable)} this CPU runs')
    print_log(f'mmpe fused CPU attention kernel: the {isa} variant ({how})',
              logger='current')
    return isa


@torch.library.custom_op('mmpe::fused_attention', mutates_args=())
def _fused_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
              values_k: Optional[Tensor], values_q: Optional[Tensor],
              with_sums: bool, num_buckets: int, rows: Tensor, cols: Tensor,
              layout: List[int], block_elements: int, min_rows: int,
              isa: str) -> Tuple[Tensor, Tensor, Tensor]:
    # no copies of q, k, v: the kernel converts one head at a time
    q, k, v, mask, vk, vq = _kernel_inputs(q, k, v, mask, values_k, values_q)
    out, lse, sums = _ext.fused_forward(q, k, v, mask, vk, vq, with_sums,
                                        num_buckets, rows.contiguous(),
                                        cols.contiguous(), layout,
                                        block_elements, min_rows,
                                        isa or kernel_isa())
    # bfloat16 / float16: the output (rounded by the kernel) and the bucket
    # sums in the input dtype, the log-sum-exp kept in float32 for the
    # backward
    return out, lse, sums.to(q.dtype)


@_fused_op.register_fake
def _fused_fake(q, k, v, mask, values_k, values_q, with_sums, num_buckets,
                rows, cols, layout, block_elements, min_rows, isa):
    b, h, length, _ = q.shape
    sums = q.new_empty((b, h, length, num_buckets) if with_sums else (0, ))
    return (q.new_empty(b, h, length, v.shape[-1]),
            q.new_empty(b, h, length, dtype=compute_dtype(q.dtype)), sums)


@torch.library.custom_op('mmpe::fused_attention_backward', mutates_args=())
def _fused_backward_op(grad_out: Tensor, grad_sums: Optional[Tensor],
                       q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                       lse: Tensor, mask: Optional[Tensor],
                       values_k: Optional[Tensor],
                       values_q: Optional[Tensor], num_buckets: int,
                       rows: Tensor, cols: Tensor, layout: List[int],
                       block_elements: int, min_rows: int,
                       isa: str) -> List[Tensor]:
    # no copies here: they would live beside the saved views through the
    # whole backward (ViT-S, 4,096 tokens: peak 1.64x -> 1.36x of fused
    # attention); the kernel copies one head at a time instead
    q, k, v, mask, vk, vq = _kernel_inputs(q, k, v, mask, values_k, values_q)
    grad_out, grad_sums = (None if x is None else
                           x if x.stride(-1) == 1 else x.contiguous()
                           for x in (grad_out, grad_sums))
    if grad_sums is not None:  # (B, H, L, nb), as the values
        grad_sums = grad_sums.to(compute_dtype(q.dtype))
    dq, dk, dv, dvk, dvq = _ext.fused_backward(
        grad_out, grad_sums, q, k, v, out.contiguous(), lse.contiguous(),
        mask, vk, vq, num_buckets, rows.contiguous(), cols.contiguous(),
        layout, block_elements, min_rows, isa or kernel_isa())
    # broadcast values (a bias table) get the sum over their broadcast dims
    dvk, dvq = (d if x is None else d.sum_to_size(x.shape).contiguous()
                for d, x in ((dvk, values_k), (dvq, values_q)))
    return [dq, dk, dv, dvk, dvq]


@_fused_backward_op.register_fake
def _fused_backward_fake(grad_out, grad_sums, q, k, v, out, lse, mask,
                         values_k, values_q, num_buckets, rows, cols, layout,
                         block_elements, min_rows, isa):
    return [x.new_empty(x.shape) for x in (q, k, v)] + [
        q.new_empty((0, )) if x is None else x.new_empty(x.shape)
        for x in (values_k, values_q)
    ]


def _kernel_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
                   values_k: Optional[Tensor],
                   values_q: Optional[Tensor]) -> tuple:
    """The kernel's layouts: a contiguous last dim everywhere (q, k, v stay
    in their dtype and may be strided views of a fused projection: the
    kernel makes one head's contiguous compute-dtype copies at a time); the
    mask and the values as (B, H, L, .) views of their broadcast forms."""
    b, h, length, _ = q.shape
    q, k, v = (x.contiguous() if x.stride(-1) != 1 else x for x in (q, k, v))
    if mask is not None:
        mask = mask.expand(b, h, length, length)
        if mask.stride(-1) != 1:
            mask = mask.contiguous()
    full = []
    for values in (values_k, values_q):
        if values is not None:
            # contiguous before the expand: a (1, H, 1, nb) table stays a
            # view with stride 0 along the batch and the rows, which the
            # backward's gradient buffer follows (one row per (b, h))
            if values.stride(-1) != 1:
                values = values.contiguous()
            values = values.expand(b, h, length, values.shape[-1])
        full.append(values)
    return (q, k, v, mask, *full)


def _setup_context(ctx, inputs, output) -> None:
    (q, k, v, mask, values_k, values_q, with_sums, num_buckets, rows, cols,
     layout, block_elements, min_rows, isa) = inputs
    out, lse, _ = output
    ctx.save_for_backward(q, k, v, out, lse, mask, values_k, values_q, rows,
                          cols)
    ctx.args = (num_buckets, layout, block_elements, min_rows, isa)
    ctx.with_sums = with_sums


def _backward(ctx, grad_out: Tensor, _grad_lse: Optional[Tensor],
              grad_sums: Optional[Tensor]):
    q, k, v, out, lse, mask, values_k, values_q, rows, cols = \
        ctx.saved_tensors
    if not ctx.with_sums:
        grad_sums = None
    dq, dk, dv, dvk, dvq = torch.ops.mmpe.fused_attention_backward(
        grad_out, grad_sums, q, k, v, out, lse, mask, values_k, values_q,
        *ctx.args[:1], rows, cols, *ctx.args[1:])
    return (dq, dk, dv, None, None if values_k is None else dvk,
            None if values_q is None else dvq) + (None, ) * 8


_fused_op.register_autograd(_backward, setup_context=_setup_context)


def kernel_layout(term: AxisValues) -> List[int]:
    """The kernel's description of the terms' buckets: ``[product, Sy, Sx,
    column offset, skip, extra0, extra1]`` (-1: no extra bucket)."""
    extras = list(term.extras) + [-1] * (2 - len(term.extras))
    offset = term.row_buckets if term.col_offset is None else term.col_offset
    return [int(term.layout == 'product'), term.row_buckets,
            term.col_buckets, offset, term.skip] + extras


def as_4d(x: Tensor) -> Tensor:
    return x.reshape((1, ) * (4 - x.dim()) + tuple(x.shape))


def fused_attention(q: Tensor,
                    k: Tensor,
                    v: Tensor,
                    mask: Optional[Tensor],
                    terms: Sequence[AxisValues],
                    block_rows: Optional[int] = None,
                    isa: Optional[str] = None) -> Tensor:
    """Attention with per-axis relative terms through the fused kernel.

    Args:
        q (Tensor): Scaled (and rotated) queries (B, H, L, d), ``L = skip
            + h * w``; a dtype of :data:`FUSED_DTYPES` (bfloat16 / float16
            computed in float32, the output in the dtype of ``q``).
        k (Tensor): Keys (B, H, L, d).
        v (Tensor): Values (B, H, L, dv).
        mask (Tensor, optional): Additive mask broadcastable to
            (B, H, L, L) (taken in the compute dtype of ``q``).
        terms (list[AxisValues]): At most one term on each of keys,
            queries and values (``on``), on one grid and bucket layout.
        block_rows (int, optional): Query rows per block; None: about
            :data:`BLOCK_ELEMENTS` logits per block, at least
            :data:`MIN_BLOCK_ROWS` rows.
        isa (str, optional): The kernel variant to run (one of
            :func:`runnable_kernel_isas`; tests and benchmarks compare
            them); None: the process's choice, :func:`kernel_isa`.

    Returns:
        Tensor: (B, H, L, dv), differentiable in ``q``, ``k``, ``v`` and
        every term's ``values``.
    """
    by_on = {term.on: term for term in terms}
    if len(by_on) != len(terms) or not terms:
        raise ValueError(f'fused_attention takes one term per `on`, got '
                         f'{[term.on for term in terms]}')
    dtype = q.dtype
    compute = compute_dtype(dtype)  # of the mask and the values too
    if mask is not None:
        mask = as_4d(mask.to(compute))
    values = {on: as_4d(by_on[on].values.to(compute))
              for on in ('k', 'q') if on in by_on}
    value_term = by_on.get('v')
    num_buckets = (value_term.values.shape[-2] if value_term is not None
                   else next(iter(values.values())).shape[-1])
    geo = terms[0]
    out, _, sums = torch.ops.mmpe.fused_attention(
        q, k.to(dtype), v.to(dtype), mask, values.get('k'), values.get('q'),
        value_term is not None, num_buckets, geo.rows, geo.cols,
        kernel_layout(geo),
        # the kernel's rule: max(min_rows, block_elements // L) rows
        *((BLOCK_ELEMENTS, MIN_BLOCK_ROWS) if block_rows is None else
          (0, block_rows)), isa or '')
    if value_term is not None:  # Eq. 17: z_i += sum_b s_ib r^V_b
        table = value_term.values.to(dtype)  # (H', nb, dv)
        out = out + (sums @ table[0] if table.shape[0] == 1 else
                     sums @ table)
    return out
