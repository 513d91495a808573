"""Exact attention with relative terms in bounded memory: query chunks, and
a backward that recomputes each chunk.

For the attention of :class:`~mmpe.models.layers.PEAttention` (logits
``e = q k^T / sqrt(d) + sum_t T^t + m``, probabilities ``P = softmax(e)``,
output ``O = P v + sum_t (value terms)``, with attention dropout on
``P`` where asked), the forward runs
:func:`~mmpe.models.layers.attention.ops.attention_probs` - the explicit
backend's step - on ``R`` query rows at a time, so only a
``(B, H, R, L)`` block of logits ever exists, and saves ``q``, ``k``,
``v``, the relative terms' small tensors (their per-bucket lookups,
``(B, H, L, K)``, or tables) and ``O``. The backward recomputes each
chunk's probabilities with the same step (each row is complete, so the
softmax is recomputed exactly; no log-sum-exp needs saving) and applies,
per chunk,

.. math::

    dv \\mathrel{+}= P^T dO, \\quad
    dP = dO\\, v^T + (\\text{value terms' share}), \\quad
    dE = P \\odot (dP - \\mathrm{rowsum}(dP \\odot P)), \\quad
    dq = dE\\, k / \\sqrt d, \\quad dk \\mathrel{+}= dE^T q / \\sqrt d

(``rowsum(dP * P) = rowsum(dO * O)`` with ``O`` including the value
terms), and each term's adjoint on ``dE`` (logit terms) or on ``dP`` and
``dO`` (value terms). No ``(B, H, L, L)`` tensor lives between forward and
backward, and the peak is ``O(B H R L)`` instead of ``O(B H L^2)``. With
``save_probs`` there is one chunk and the probabilities are saved instead
of recomputed: the explicit backend's arithmetic and memory, used while a
compiler traces the explicit backend. Dropout masks are not stored either:
the backward draws them again (:class:`ChunkDropout`).

Both passes are ``torch.library`` custom ops (``mmpe::attention``,
``mmpe::attention_backward``) with fake (meta) kernels and an autograd
registration, so a compiled graph (``torch.compile``, dynamic shapes)
calls these eager kernels - in-place softmax, in-place expansion, reused
buffers - as one opaque node instead of tracing them into functional code.
The exporters never see them: inference takes SDPA (see ``PEAttention``).
"""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..terms.registry import build_terms, encode_terms
from ..terms.relative_term import RelativeTerm, split_terms
from .ops import attention_probs, softmax_backward_

#: Query rows per chunk of the automatic rule: a (B, H, R, L) block stays
#: in cache (measured on CPU, docs/benchmark.md, "Long sequences").
CHUNK_ROWS = 64
#: Most elements of one (B, H, R, L) block (two live at a time, four with
#: dropout; float32: 2 x 16 MB): fewer rows for large ``B * H * L``.
CHUNK_ELEMENTS = 2**22
#: Fewest query rows per chunk (smaller chunks lose matmul efficiency).
MIN_CHUNK_ROWS = 16


def chunk_rows(batch_heads: int, length: int, chunk_size: int = 0) -> int:
    """Query rows per chunk.

    Args:
        batch_heads (int): ``B * H``.
        length (int): Tokens ``L``.
        chunk_size (int): Rows asked for; 0: :data:`CHUNK_ROWS`, fewer if
            a block would exceed :data:`CHUNK_ELEMENTS` (at least
            :data:`MIN_CHUNK_ROWS`).

    Returns:
        int: Between 1 and ``L``.
    """
    if chunk_size <= 0:
        fit = CHUNK_ELEMENTS // max(1, batch_heads * length)
        chunk_size = max(MIN_CHUNK_ROWS, min(CHUNK_ROWS, fit))
    return max(1, min(length, chunk_size))


def _bounds(length: int, rows: int) -> List[Tuple[int, int]]:
    return [(s, min(s + rows, length)) for s in range(0, length, rows)]


def _buffer(like: Tensor, numel: int) -> Tensor:
    """A flat scratch buffer reused by every chunk (fresh large buffers
    cost page faults on CPU, see docs/benchmark.md)."""
    return like.new_empty(numel)


class ChunkDropout:
    """Attention dropout whose masks the backward can draw again.

    The masks come from a generator seeded once per call and are drawn
    chunk by chunk in a fixed order, so the backward, drawing in the same
    order, gets the forward's masks without storing them. Kept
    probabilities are scaled by ``1 / (1 - p)`` (``F.dropout``'s
    convention; the draws themselves differ from ``F.dropout``'s).

    Args:
        p (float): Drop probability; 0 disables.
        seed (Tensor, optional): One integer, required when ``p > 0``.
        device (torch.device): Device of the masks.
    """

    def __init__(self, p: float, seed: Optional[Tensor],
                 device: torch.device) -> None:
        self.p, self.gen = p, None
        if p > 0:
            self.gen = torch.Generator(device=device)
            self.gen.manual_seed(int(seed))

    def scale(self, like: Tensor, out: Tensor) -> Optional[Tensor]:
        """The next mask as ``keep / (1 - p)`` in ``out`` (of ``like``'s
        shape), or None without dropout."""
        if self.gen is None:
            return None
        out = out.view(like.shape).bernoulli_(1 - self.p, generator=self.gen)
        return out.div_(1 - self.p)


def attention_forward(qs: Tensor,
                      k: Tensor,
                      v: Tensor,
                      mask: Optional[Tensor],
                      terms: Sequence[RelativeTerm],
                      chunk_size: int = 0,
                      save_probs: bool = False,
                      dropout: Optional[ChunkDropout] = None
                      ) -> Tuple[Tensor, Tensor]:
    """The forward pass (no autograd graph).

    Args:
        qs (Tensor): Scaled (and rotated) queries (B, H, L, d).
        k (Tensor): Keys (B, H, L_k, d); L_k = L in self-attention,
            any in cross-attention (blocks of logits are (B, H, R, L_k)).
        v (Tensor): Values (B, H, L_k, dv).
        mask (Tensor, optional): Additive mask broadcastable to
            (B, H, L, L_k).
        terms (list[RelativeTerm]): Relative terms.
        chunk_size (int): Query rows per chunk (0: automatic).
        save_probs (bool): One chunk, and return the probabilities.
        dropout (ChunkDropout, optional): Attention dropout (applied to the
            probabilities that meet ``v`` and the value terms).

    Returns:
        tuple[Tensor, Tensor]: Output (B, H, L, dv) and the probabilities
        (B, H, L, L), before dropout, with ``save_probs``, else an empty
        tensor.
    """
    logit_terms, value_terms = split_terms(terms)
    dropout = dropout or ChunkDropout(0.0, None, qs.device)
    b, h, length, _ = qs.shape
    keys = k.shape[2]  # = length in self-attention
    if save_probs:
        probs = attention_probs(qs, k, logit_terms, mask)
        dropped = probs
        if dropout.gen is not None:
            dropped = dropout.scale(probs, torch.empty_like(probs)).mul_(probs)
        out = dropped @ v
        for term in value_terms:
            out.add_(term.out_rows(dropped, None))
        return out, probs
    rows = min(length, chunk_rows(b * h, keys, chunk_size))
    out = qs.new_empty(b, h, length, v.shape[-1])
    scratch = _buffer(qs, b * h * rows * keys)
    scratch_keep = _buffer(qs, 0 if dropout.gen is None else scratch.numel())
    for start, stop in _bounds(length, rows):
        span, numel = (start, stop), b * h * (stop - start) * keys
        logits = scratch[:numel].view(b, h, stop - start, keys)
        probs = attention_probs(qs[:, :, start:stop], k, logit_terms, mask,
                                span, out=logits)
        keep = dropout.scale(probs, scratch_keep[:numel])
        if keep is not None:
            probs.mul_(keep)  # the undropped rows are not needed any more
        for i in range(b):  # (H, R, L) @ (H, L, dv), v in any strides
            out[i, :, start:stop] = torch.bmm(probs[i], v[i])
        for term in value_terms:
            out[:, :, start:stop] += term.out_rows(probs, span)
    return out, qs.new_empty(0)


def attention_backward(grad_out: Tensor,
                       qs: Tensor,
                       k: Tensor,
                       v: Tensor,
                       mask: Optional[Tensor],
                       terms: Sequence[RelativeTerm],
                       probs: Optional[Tensor] = None,
                       chunk_size: int = 0,
                       dropout: Optional[ChunkDropout] = None
                       ) -> List[Tensor]:
    """The backward pass: gradients of ``qs``, ``k``, ``v`` and of every
    term tensor (in :func:`encode_terms` order).

    Args:
        grad_out (Tensor): ``dL/dO`` (B, H, L, dv).
        qs, k, v, mask, terms: As :func:`attention_forward`.
        probs (Tensor, optional): Saved probabilities (B, H, L, L) (one
            chunk); None: recomputed chunk by chunk.
        chunk_size (int): As :func:`attention_forward`.
        dropout (ChunkDropout, optional): A fresh one with the forward's
            seed: it draws the forward's masks again.

    Returns:
        list[Tensor]: ``[dqs, dk, dv, *dtensors]``.
    """
    logit_terms, value_terms = split_terms(terms)
    dropout = dropout or ChunkDropout(0.0, None, qs.device)
    b, h, length, d = qs.shape
    keys = k.shape[2]  # = length in self-attention
    n = b * h
    dqs = qs.new_empty(qs.shape)
    dk, dv = k.new_zeros(k.shape), v.new_zeros(v.shape)
    grads = {id(t): [x.new_zeros(x.shape) for x in t.tensors] for t in terms}
    for term in value_terms:
        term.begin_backward(grad_out)
    rows = length if probs is not None else min(
        length, chunk_rows(n, keys, chunk_size))
    scratch_p = None if probs is not None else _buffer(qs, n * rows * keys)
    scratch_dp = _buffer(qs, n * rows * keys)
    # dropout: the masks and the dropped probabilities of a chunk
    scratch_keep, scratch_pd = (_buffer(
        qs, 0 if dropout.gen is None else n * rows * keys)
                                for _ in range(2))
    for start, stop in _bounds(length, rows):
        span, r = (start, stop), stop - start
        q_rows = qs[:, :, start:stop]
        if probs is not None:
            p = probs
        else:
            p = attention_probs(
                q_rows, k, logit_terms, mask, span,
                out=scratch_p[:n * r * keys].view(b, h, r, keys))
        numel = n * r * keys
        keep = dropout.scale(p, scratch_keep[:numel])
        # the probabilities that met v: dropped ones with dropout
        pd = p if keep is None else torch.mul(
            p, keep, out=scratch_pd[:numel].view(p.shape))
        go = grad_out[:, :, start:stop]  # (B, H, R, dv), any strides
        # dP = dO v^T (+ the value terms' share), (B, H, R, L)
        dp = scratch_dp[:numel].view(b, h, r, keys)
        for i in range(b):
            torch.bmm(go[i], v[i].transpose(-2, -1), out=dp[i])
            dv[i].baddbmm_(pd[i].transpose(-2, -1), go[i])
        for term in value_terms:
            term.backward_rows(dp, span, grads[id(term)], probs=pd,
                               grad_out=go)
        if keep is not None:
            dp.mul_(keep)  # through the dropout: the kept ones, scaled
        de = softmax_backward_(dp, p)  # dE, in dp's buffer on CPU
        for i in range(b):
            dqs[i, :, start:stop] = torch.bmm(de[i], k[i])
            dk[i].baddbmm_(de[i].transpose(-2, -1), q_rows[i])
        for term in logit_terms:
            term.backward_rows(de, span, grads[id(term)])
    for term in terms:
        term.end_backward(grads[id(term)])
    return [dqs, dk, dv] + [g for t in terms for g in grads[id(t)]]


# ---------------------------------------------------------------------------
# the custom ops
# ---------------------------------------------------------------------------
@torch.library.custom_op('mmpe::attention', mutates_args=())
def _attention_op(qs: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
                  tensors: List[Tensor], terms: str, height: int, width: int,
                  chunk_size: int, save_probs: bool, dropout_p: float,
                  seed: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    built = build_terms(terms, tensors, height, width, qs.shape[2])
    with torch.no_grad(), torch.autocast(qs.device.type, enabled=False):
        return attention_forward(qs, k, v, mask, built, chunk_size,
                                 save_probs,
                                 ChunkDropout(dropout_p, seed, qs.device))


@_attention_op.register_fake
def _attention_fake(qs, k, v, mask, tensors, terms, height, width,
                    chunk_size, save_probs, dropout_p, seed):
    b, h, length, _ = qs.shape
    out = qs.new_empty(b, h, length, v.shape[-1])
    probs = qs.new_empty((b, h, length, k.shape[2]) if save_probs else (0, ))
    return out, probs


@torch.library.custom_op('mmpe::attention_backward', mutates_args=())
def _attention_backward_op(grad_out: Tensor, qs: Tensor, k: Tensor,
                           v: Tensor, mask: Optional[Tensor],
                           tensors: List[Tensor], probs: Tensor, terms: str,
                           height: int, width: int, chunk_size: int,
                           dropout_p: float,
                           seed: Optional[Tensor]) -> List[Tensor]:
    built = build_terms(terms, tensors, height, width, qs.shape[2])
    with torch.no_grad(), torch.autocast(qs.device.type, enabled=False):
        return attention_backward(grad_out, qs, k, v, mask, built,
                                  probs if probs.numel() else None,
                                  chunk_size,
                                  ChunkDropout(dropout_p, seed, qs.device))


@_attention_backward_op.register_fake
def _attention_backward_fake(grad_out, qs, k, v, mask, tensors, probs,
                             terms, height, width, chunk_size, dropout_p,
                             seed):
    # contiguous, as the real kernel returns them
    return [x.new_empty(x.shape) for x in (qs, k, v, *tensors)]


def _setup_context(ctx, inputs, output) -> None:
    (qs, k, v, mask, tensors, terms, height, width, chunk_size, _,
     dropout_p, seed) = inputs
    # the mask is never differentiated (as in the explicit backend)
    ctx.save_for_backward(qs, k, v, output[1], mask, seed, *tensors)
    ctx.args = (terms, height, width, chunk_size, dropout_p)


def _backward(ctx, grad_out: Tensor, _grad_probs: Optional[Tensor]):
    qs, k, v, probs, mask, seed, *tensors = ctx.saved_tensors
    terms, height, width, chunk_size, dropout_p = ctx.args
    grads = torch.ops.mmpe.attention_backward(grad_out, qs, k, v, mask,
                                              tensors, probs, terms, height,
                                              width, chunk_size, dropout_p,
                                              seed)
    dqs, dk, dv, *dtensors = grads
    return (dqs, dk, dv, None, dtensors) + (None, ) * 7


_attention_op.register_autograd(_backward, setup_context=_setup_context)


def relative_attention(qs: Tensor,
                       k: Tensor,
                       v: Tensor,
                       mask: Optional[Tensor],
                       terms: Sequence[RelativeTerm],
                       height: int,
                       width: int,
                       chunk_size: int = 0,
                       save_probs: bool = False,
                       dropout_p: float = 0.0) -> Tensor:
    """Attention with relative terms through ``mmpe::attention``.

    Args:
        qs (Tensor): Scaled (and rotated) queries (B, H, L, d).
        k (Tensor): Keys (B, H, L_k, d) (L_k = L in self-attention).
        v (Tensor): Values (B, H, L, dv).
        mask (Tensor, optional): Additive mask broadcastable to
            (B, H, L, L), in the dtype of ``qs``.
        terms (list[RelativeTerm]): The call's relative terms.
        height (int): Grid height (may be symbolic while tracing).
        width (int): Grid width.
        chunk_size (int): Query rows per chunk; 0: automatic
            (:func:`chunk_rows`).
        save_probs (bool): Save the probabilities instead of recomputing
            them (one chunk; the explicit backend's memory).
        dropout_p (float): Attention dropout (:class:`ChunkDropout`, seeded
            from the global generator).

    Returns:
        Tensor: (B, H, L, dv), differentiable in ``qs``, ``k``, ``v`` and
        the terms' tensors.
    """
    spec, tensors = encode_terms(terms)
    dtype = qs.dtype
    # one seed per call, from the global generator (reproducible with
    # torch.manual_seed); the backward draws the masks again from it
    seed = torch.randint(2**62, (1, )) if dropout_p > 0 else None
    out, _ = torch.ops.mmpe.attention(
        qs, k.to(dtype), v.to(dtype), None if mask is None else mask.to(dtype),
        [x.to(dtype) for x in tensors], spec, height, width, chunk_size,
        save_probs, float(dropout_p), seed)
    return out
