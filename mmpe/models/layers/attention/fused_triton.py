"""Exact attention with per-axis relative terms in one Triton kernel (CUDA).

The GPU counterpart of the fused CPU kernel (:mod:`.fused`), under the same
contract: scaled queries ``q`` (B, H, Q, d), keys and values (B, H, L, d)
of a grid, an additive mask, and at most one term per role given as
:class:`~mmpe.models.layers.terms.relative_term.AxisValues` (iRPE product /
cross on queries, keys and values, Wu et al. ICCV 2021, Eq. 16-17, skip
tokens included; ViTDet's decomposed relative position; Plain-DETR's
box-to-pixel bias of a decoder cross-attention, whose ``Q`` queries are
not grid tokens). It computes

.. math::

    e_{ij} = q_i k_j^T + T_{ij} + m_{ij}, \\quad
    o_i = \\sum_j \\mathrm{softmax}_j(e_{ij}) v_j (+ \\sum_j p_{ij}
    r^V_{b(i, j)})

flash-attention style (:mod:`.triton_kernels`): row blocks, online softmax,
the term read from the per-query values inside the tile, the log-sum-exp
saved, a backward that recomputes the probabilities and returns ``dq``,
``dk``, ``dv`` and the values' gradients (bucket sums of ``dE``), from
which autograd reaches the tables. Statistics and sums are float32;
float32 (IEEE products, no TF32), bfloat16 and float16 inputs; attention
dropout inside the kernels. The launches (grids, arguments, tile sizes)
are built by :mod:`.triton_launch`, which the compile report
(``tools/analysis/kernel_report.py``) compiles for a GPU target.

Registered as the ``torch.library`` custom ops ``mmpe::triton_attention``
/ ``mmpe::triton_attention_backward`` (fake kernels, autograd), so that a
compiled graph calls it as one node. Triton compiles the kernels for
CUDA; with ``TRITON_INTERPRET=1`` set before Triton is imported its
interpreter runs them on CPU tensors (the tests).
"""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..terms.relative_term import AxisValues
from .fused import as_4d, kernel_layout
from .triton_launch import (TRITON_IMPORT_ERROR, backward_launches,
                            dropout_mask_launch, forward_launch)
from . import triton_launch

#: dtypes of q, k, v the kernel takes (statistics in float32)
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: The largest head dimension the tiles take
MAX_HEAD_DIM = 256


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET=1``
    when they were defined): then they take CPU tensors."""
    kernels = triton_launch._kernels
    if kernels is None:
        return False
    return type(kernels.fused_forward_kernel).__name__ == \
        'InterpretedFunction'


def triton_unavailable_reason(device: torch.device) -> Optional[str]:
    """Why the Triton kernel cannot run on ``device``, or None."""
    if TRITON_IMPORT_ERROR is not None:
        return TRITON_IMPORT_ERROR
    if device.type == 'cuda' or (device.type == 'cpu' and interpreted()):
        return None
    return (f'it runs on CUDA (or in Triton\'s interpreter, '
            f'TRITON_INTERPRET=1), not {device.type}')


def _seed(seed: Optional[Tensor]) -> int:
    """The dropout seed as the kernels take it (31 bits; 0 without)."""
    return 0 if seed is None else int(seed.reshape(-1)[0]) % (2**31 - 2**20)


@torch.library.custom_op('mmpe::triton_attention', mutates_args=())
def _triton_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
               values_k: Optional[Tensor], values_q: Optional[Tensor],
               with_sums: bool, num_buckets: int, rows: Tensor, cols: Tensor,
               layout: List[int], dropout_p: float,
               seed: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    launch, out, lse, sums = forward_launch(
        q, k, v, mask, values_k, values_q, with_sums, num_buckets, rows,
        cols, layout, _seed(seed), dropout_p, interpreted())
    launch()
    return out, lse, sums


@_triton_op.register_fake
def _triton_fake(q, k, v, mask, values_k, values_q, with_sums, num_buckets,
                 rows, cols, layout, dropout_p, seed):
    b, h, lq, _ = q.shape
    sums = (q.new_empty((b, h, lq, num_buckets), dtype=torch.float32)
            if with_sums else q.new_empty((0, )))
    return (q.new_empty(b, h, lq, v.shape[-1]),
            q.new_empty(b, h, lq, dtype=torch.float32), sums)


def backward_delta(grad_out: Tensor, out: Tensor,
                   grad_sums: Optional[Tensor],
                   sums: Optional[Tensor]) -> Tensor:
    """``delta_i = rowsum(P * dP) = dO_i . O_i (+ ds_i . s_i``, the value
    term), float32 (B, H, Q)."""
    delta = (grad_out.float() * out.float()).sum(-1)
    if grad_sums is not None:
        delta = delta + (grad_sums * sums).sum(-1)
    return delta.contiguous()


@torch.library.custom_op('mmpe::triton_attention_backward', mutates_args=())
def _triton_backward_op(grad_out: Tensor, grad_sums: Optional[Tensor],
                        q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                        lse: Tensor, sums: Optional[Tensor],
                        mask: Optional[Tensor], values_k: Optional[Tensor],
                        values_q: Optional[Tensor], rows: Tensor,
                        cols: Tensor, layout: List[int], dropout_p: float,
                        seed: Optional[Tensor]) -> List[Tensor]:
    grad_out = grad_out.contiguous()
    if grad_sums is not None:
        grad_sums = grad_sums.float().contiguous()
    delta = backward_delta(grad_out, out, grad_sums, sums)
    launches, (dq, dk, dv, dvk, dvq) = backward_launches(
        grad_out, grad_sums, q, k, v, delta, lse, mask, values_k, values_q,
        rows, cols, layout, _seed(seed), dropout_p, interpreted())
    for launch in launches:
        launch()
    # broadcast values (a bias table) get the sum over their broadcast dims
    grads = [dq, dk, dv]
    for g, x in ((dvk, values_k), (dvq, values_q)):
        grads.append(q.new_empty((0, )) if x is None else
                     g.sum_to_size(x.shape).to(x.dtype).contiguous())
    return grads


@_triton_backward_op.register_fake
def _triton_backward_fake(grad_out, grad_sums, q, k, v, out, lse, sums, mask,
                          values_k, values_q, rows, cols, layout, dropout_p,
                          seed):
    return [x.new_empty(x.shape) for x in (q, k, v)] + [
        q.new_empty((0, )) if x is None else x.new_empty(x.shape)
        for x in (values_k, values_q)
    ]


def _setup_context(ctx, inputs, output) -> None:
    (q, k, v, mask, values_k, values_q, with_sums, _, rows, cols, layout,
     dropout_p, seed) = inputs
    out, lse, sums = output
    ctx.save_for_backward(q, k, v, out, lse, sums if with_sums else None,
                          mask, values_k, values_q, rows, cols, seed)
    ctx.layout = layout
    ctx.dropout_p = dropout_p
    ctx.with_sums = with_sums


def _backward(ctx, grad_out: Tensor, _grad_lse: Optional[Tensor],
              grad_sums: Optional[Tensor]):
    q, k, v, out, lse, sums, mask, values_k, values_q, rows, cols, seed = \
        ctx.saved_tensors
    if not ctx.with_sums:
        grad_sums = sums = None
    elif grad_sums is None:
        grad_sums = torch.zeros_like(sums)
    dq, dk, dv, dvk, dvq = torch.ops.mmpe.triton_attention_backward(
        grad_out, grad_sums, q, k, v, out, lse, sums, mask, values_k,
        values_q, rows, cols, ctx.layout, ctx.dropout_p, seed)
    return (dq, dk, dv, None, None if values_k is None else dvk,
            None if values_q is None else dvq) + (None, ) * 7


_triton_op.register_autograd(_backward, setup_context=_setup_context)


def triton_layout(term: AxisValues) -> List[int]:
    """The kernel's description of the terms' buckets: the CPU kernel's
    (:func:`~.fused.kernel_layout`) and whether the queries are the grid's
    tokens."""
    return kernel_layout(term) + [int(term.query_grid)]


def triton_op_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
                     terms: Sequence[AxisValues],
                     dropout_p: float = 0.0) -> Tuple[tuple, Optional[
                         AxisValues]]:
    """The arguments of ``mmpe::triton_attention`` for a call of
    :func:`triton_attention` (same arguments), and the term on values
    (applied to the op's bucket sums after it), or None."""
    by_on = {term.on: term for term in terms}
    if len(by_on) != len(terms) or not terms:
        raise ValueError(f'triton_attention takes one term per `on`, got '
                         f'{[term.on for term in terms]}')
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    if mask is not None:
        mask = as_4d(mask.float()).expand(b, h, lq, lk)
        if mask.stride(-1) != 1:
            mask = mask.contiguous()
    # the values in their dtype and their broadcast shape (a bias table
    # (1, H, 1, nb) stays one): saved for the backward as they are, and
    # their gradient is summed to that shape (the launches expand them)
    values = {
        on: as_4d(by_on[on].values)
        for on in ('k', 'q') if on in by_on
    }
    value_term = by_on.get('v')
    num_buckets = (value_term.values.shape[-2] if value_term is not None
                   else next(iter(values.values())).shape[-1])
    geo = terms[0]
    # one seed per call, from the global generator (as the chunked backend)
    seed = torch.randint(2**31 - 1, (1, )) if dropout_p > 0 else None
    return (q, k.to(q.dtype), v.to(q.dtype), mask, values.get('k'),
            values.get('q'), value_term is not None, num_buckets,
            geo.rows.contiguous(), geo.cols.contiguous(), triton_layout(geo),
            float(dropout_p), seed), value_term


def triton_attention(q: Tensor,
                     k: Tensor,
                     v: Tensor,
                     mask: Optional[Tensor],
                     terms: Sequence[AxisValues],
                     dropout_p: float = 0.0) -> Tensor:
    """Attention with per-axis relative terms through the Triton kernel.

    Args:
        q (Tensor): Scaled (and rotated) queries (B, H, Q, d): ``Q = skip
            + h * w`` for grid queries, any ``Q`` when the terms'
            ``query_grid`` is False; a dtype of :data:`TRITON_DTYPES`.
        k (Tensor): Keys (B, H, L, d), ``L = skip + h * w``.
        v (Tensor): Values (B, H, L, dv).
        mask (Tensor, optional): Additive mask broadcastable to
            (B, H, Q, L) (taken in float32).
        terms (list[AxisValues]): At most one term on each of keys,
            queries and values (``on``), on one grid and bucket layout.
        dropout_p (float): Attention dropout on the probabilities (the
            value term sees them dropped too, as in the explicit backend);
            the mask comes from a seed drawn from the global generator
            (reproducible with ``torch.manual_seed``; :func:`dropout_mask`
            gives it), redrawn, not stored, in the backward. Defaults to 0.

    Returns:
        Tensor: (B, H, Q, dv), differentiable in ``q``, ``k``, ``v`` and
        every term's ``values``.
    """
    args, value_term = triton_op_inputs(q, k, v, mask, terms, dropout_p)
    out, _, sums = torch.ops.mmpe.triton_attention(*args)
    if value_term is not None:  # Eq. 17: z_i += sum_b s_ib r^V_b
        table = value_term.values.to(q.dtype)  # (H', nb, dv)
        sums = sums.to(q.dtype)
        out = out + (sums @ table[0] if table.shape[0] == 1 else
                     sums @ table)
    return out


def dropout_mask(seed: Tensor, dropout_p: float, batch: int, heads: int,
                 queries: int, keys: int, device: torch.device) -> Tensor:
    """The dropout scale (B, H, Q, L) a call with ``seed`` draws: ``1 /
    (1 - p)`` where a probability is kept, 0 where it is dropped."""
    out = torch.empty(batch * heads, queries, keys, device=device)
    dropout_mask_launch(out, _seed(seed), dropout_p, heads, queries, keys)()
    return out.view(batch, heads, queries, keys)
