"""Exact attention with a per-axis relative term in one CPU kernel.

For scaled queries, keys and values (B, H, L, d) of an ``h x w`` grid and a
logit term given as per-query values over per-axis buckets
(:class:`~mmpe.models.layers.attention_terms.AxisValues`: iRPE's product
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

It is the CPU counterpart of FlexAttention (:mod:`.irpe_flex`): the same
function as the explicit and chunked backends for the terms it reads,
nothing else. The pair is registered as the ``torch.library`` custom ops
``mmpe::fused_attention`` / ``mmpe::fused_attention_backward`` (fake
kernels, autograd registration), so compiled graphs call it as one node.
The kernel is compiled when mmpe is installed (``setup.py``, as mmcv's
ops); without it (:func:`fused_unavailable_reason`) the attention core
runs its other backends.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .attention_terms import AxisValues

try:
    from mmpe import _ext  # the compiled kernel (setup.py)
    _EXT_ERROR: Optional[str] = None
except ImportError as e:  # not built (no compiler at install time)
    _ext = None
    _EXT_ERROR = f'the compiled kernel mmpe._ext is not built ({e})'

#: dtypes the kernel computes in (float32 exp is vectorised; float64 for
#: the tests' tight comparisons)
FUSED_DTYPES = (torch.float32, torch.float64)
#: Elements of one block of query rows against all keys (R * L): two such
#: blocks per thread stay in a 1-2 MB L2 cache (float32). Measured on CPU,
#: docs/benchmark.md ("Long sequences").
BLOCK_ELEMENTS = 2**16


def fused_unavailable_reason() -> Optional[str]:
    """Why the fused kernel cannot run in this installation, or None."""
    return _EXT_ERROR


@torch.library.custom_op('mmpe::fused_attention', mutates_args=())
def _fused_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
              values: Tensor, rows: Tensor, cols: Tensor, layout: List[int],
              block_elements: int) -> Tuple[Tensor, Tensor]:
    q, k, v, mask, full = _kernel_inputs(q, k, v, mask, values)
    out, lse = _ext.fused_forward(q, k, v, mask, full, rows.contiguous(),
                                  cols.contiguous(), layout, block_elements)
    return out, lse


@_fused_op.register_fake
def _fused_fake(q, k, v, mask, values, rows, cols, layout, block_elements):
    b, h, length, _ = q.shape
    return q.new_empty(b, h, length, v.shape[-1]), q.new_empty(b, h, length)


@torch.library.custom_op('mmpe::fused_attention_backward', mutates_args=())
def _fused_backward_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor,
                       out: Tensor, lse: Tensor, mask: Optional[Tensor],
                       values: Tensor, rows: Tensor, cols: Tensor,
                       layout: List[int],
                       block_elements: int) -> List[Tensor]:
    q, k, v, mask, full = _kernel_inputs(q, k, v, mask, values)
    grad_out = grad_out if grad_out.stride(-1) == 1 else \
        grad_out.contiguous()
    dq, dk, dv, dvalues = _ext.fused_backward(
        grad_out, q, k, v, out.contiguous(), lse.contiguous(), mask, full,
        rows.contiguous(), cols.contiguous(), layout, block_elements)
    # broadcast values (a bias table) get the sum over their broadcast dims
    return [dq, dk, dv, dvalues.sum_to_size(values.shape).contiguous()]


@_fused_backward_op.register_fake
def _fused_backward_fake(grad_out, q, k, v, out, lse, mask, values, rows,
                         cols, layout, block_elements):
    return [x.new_empty(x.shape) for x in (q, k, v, values)]


def _kernel_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
                   values: Tensor) -> tuple:
    """The kernel's layouts: a contiguous last dim everywhere; the mask and
    the values as (B, H, L, .) views of their broadcast forms."""
    b, h, length, _ = q.shape
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    if mask is not None:
        mask = mask.expand(b, h, length, length)
        if mask.stride(-1) != 1:
            mask = mask.contiguous()
    full = values.expand(b, h, length, values.shape[-1])
    if full.stride(-1) != 1:
        full = full.contiguous()
    return q, k, v, mask, full


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, mask, values, rows, cols, layout, block_elements = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, mask, values, rows, cols)
    ctx.args = (layout, block_elements)


def _backward(ctx, grad_out: Tensor, _grad_lse: Optional[Tensor]):
    q, k, v, out, lse, mask, values, rows, cols = ctx.saved_tensors
    dq, dk, dv, dvalues = torch.ops.mmpe.fused_attention_backward(
        grad_out, q, k, v, out, lse, mask, values, rows, cols, *ctx.args)
    return dq, dk, dv, None, dvalues, None, None, None, None


def kernel_layout(term: AxisValues) -> List[int]:
    """The kernel's description of a term: ``[product, Sy, Sx, column
    offset, skip, extra0, extra1]`` (-1: no extra bucket)."""
    extras = list(term.extras) + [-1] * (2 - len(term.extras))
    offset = term.row_buckets if term.col_offset is None else term.col_offset
    return [int(term.layout == 'product'), term.row_buckets,
            term.col_buckets, offset, term.skip] + extras


_fused_op.register_autograd(_backward, setup_context=_setup_context)


def fused_attention(q: Tensor,
                    k: Tensor,
                    v: Tensor,
                    mask: Optional[Tensor],
                    term: AxisValues,
                    block_elements: int = BLOCK_ELEMENTS) -> Tensor:
    """Attention with one per-axis logit term through the fused kernel.

    Args:
        q (Tensor): Scaled (and rotated) queries (B, H, L, d), ``L = skip
            + h * w``.
        k (Tensor): Keys (B, H, L, d).
        v (Tensor): Values (B, H, L, dv).
        mask (Tensor, optional): Additive mask broadcastable to
            (B, H, L, L), in the dtype of ``q``.
        term (AxisValues): The logit term.
        block_elements (int): ``R * L`` of one block of query rows.

    Returns:
        Tensor: (B, H, L, dv), differentiable in ``q``, ``k``, ``v`` and
        ``term.values``.
    """
    dtype = q.dtype
    if mask is not None:
        mask = mask.to(dtype)
        # (.., L) and (.., L, L) masks as 4-d views, expanded in the kernel
        mask = mask.reshape((1, ) * (4 - mask.dim()) + tuple(mask.shape))
    values = term.values.to(dtype)
    values = values.reshape((1, ) * (4 - values.dim()) + tuple(values.shape))
    out, _ = torch.ops.mmpe.fused_attention(
        q, k.to(dtype), v.to(dtype), mask, values, term.rows, term.cols,
        kernel_layout(term), block_elements)
    return out
