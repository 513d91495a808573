"""Two kernels of :class:`~mmpe.models.layers.PEAttention`: the constant
float mask of SDPA and the masked softmax of the explicit backend."""
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from .tracing import is_tracing

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
        if (ctx.inplace and grad.is_contiguous()
                and grad.dtype == prob.dtype):
            torch.ops.aten._softmax_backward_data.out(
                grad, prob, -1, prob.dtype, grad_input=grad)
            return grad, None
        return torch._softmax_backward_data(
            grad.to(prob.dtype), prob, -1, prob.dtype), None


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
