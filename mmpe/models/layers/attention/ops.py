"""Kernels of :class:`~mmpe.models.layers.PEAttention`: the additive mask of
key padding and ``attn_mask``, the constant float mask of SDPA, the masked
softmax (in place on CPU) and its backward, and the attention step on a
range of query rows that the explicit backend runs on all rows and the
chunked backend on one chunk at a time."""
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..common.tracing import is_tracing
from ..terms.relative_term import RelativeTerm, Rows

# device types where _MaskedSoftmax reuses its buffers (see its docstring)
_SOFTMAX_INPLACE_DEVICES = ('cpu', )


def constant_bias(terms: Sequence[Tuple[Tensor, bool]],
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
        return softmax_backward_(grad, prob), None


def softmax_backward_(grad: Tensor, prob: Tensor) -> Tensor:
    """The logits' gradient ``prob * (grad - sum_j grad * prob)`` of a
    softmax over the last dim, written into ``grad`` on CPU when it is a
    contiguous buffer of the same dtype (see :class:`_MaskedSoftmax`)."""
    if (prob.device.type in _SOFTMAX_INPLACE_DEVICES and grad.is_contiguous()
            and grad.dtype == prob.dtype):
        torch.ops.aten._softmax_backward_data.out(
            grad, prob, -1, prob.dtype, grad_input=grad)
        return grad
    return torch._softmax_backward_data(
        grad.to(prob.dtype), prob, -1, prob.dtype)


def masked_softmax(logits: Tensor, mask: Optional[Tensor]) -> Tensor:
    """``softmax(logits + mask, -1)``; ``logits`` must be a fresh buffer
    that nothing else reads (it may become the result).

    While tracing, plain ``torch.softmax``: a compiler fuses the add and the
    softmax itself and plans its own buffers, and the exporters need
    functional ops.
    """
    if is_tracing():
        return torch.softmax(logits if mask is None else logits + mask, -1)
    return _MaskedSoftmax.apply(logits, mask)


def additive_mask(attn_mask: Optional[Tensor],
                  key_padding_mask: Optional[Tensor],
                  like: Tensor) -> Optional[Tensor]:
    """One float mask (0 / -inf, plus a float ``attn_mask``) that
    broadcasts to (B, H, L_q, L_k), in the dtype of ``like``.

    Args:
        attn_mask (Tensor, optional): (L_q, L_k) bool (True = not allowed)
            or additive float.
        key_padding_mask (Tensor, optional): (B, L_k) bool, True at padding.
        like (Tensor): Gives dtype and device.

    Returns:
        Tensor | None: None when both masks are None.
    """
    mask = None
    if key_padding_mask is not None:
        # (B, L_k) -> (B, 1, 1, L_k)
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


def mask_rows(mask: Optional[Tensor], rows: Rows) -> Optional[Tensor]:
    """The rows of an additive mask broadcastable to (B, H, L, L)."""
    if mask is None or rows is None or mask.dim() < 2 or mask.shape[-2] == 1:
        return mask
    return mask[..., rows[0]:rows[1], :]


def attention_probs(qs: Tensor,
                    k: Tensor,
                    terms: Sequence[RelativeTerm],
                    mask: Optional[Tensor],
                    rows: Rows = None,
                    out: Optional[Tensor] = None) -> Tensor:
    """``softmax_j(qs_i k_j^T + sum_t T^t_ij + m_ij)`` of a range of query
    rows: the one step of both the explicit backend (all rows, inside the
    autograd graph) and the chunked one (a chunk, no graph).

    Args:
        qs (Tensor): Scaled (and rotated) queries of the rows (B, H, R, d).
        k (Tensor): Keys (B, H, L, d).
        terms (list[RelativeTerm]): Logit terms, added in place.
        mask (Tensor, optional): Additive mask of all rows, broadcastable
            to (B, H, L, L).
        rows (tuple[int, int], optional): The query rows; None: all.
        out (Tensor, optional): A contiguous (B, H, R, L) buffer for the
            logits, which become the probabilities; None: a fresh one.

    Returns:
        Tensor: Probabilities (B, H, R, L).
    """
    if out is None:
        logits = qs @ k.transpose(-2, -1)  # (B, H, R, L), fresh
    else:
        # one batch item at a time: (H, R, d) and (H, L, d) views of any
        # strides (heads split from a projection) need no copy
        for i in range(qs.shape[0]):
            torch.bmm(qs[i], k[i].transpose(-2, -1), out=out[i])
        logits = out
    for term in terms:
        logits = term.add_rows(logits, rows)
    return masked_softmax(logits, mask_rows(mask, rows))
