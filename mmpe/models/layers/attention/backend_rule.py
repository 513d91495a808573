"""The rule of ``attn_impl='auto'``: which backend of
:class:`~mmpe.models.layers.PEAttention` runs a call with relative terms,
and the memory each backend holds for it.

The rule is a pure function of the call's sizes, device type, gradient
mode and the free device memory (:func:`auto_backend`), so that it can be
checked anywhere with the inputs of any device.

* The fused kernel of the device (C++ on CPU, Triton on CUDA): where it
  applies, always (it holds no ``(L, L)`` tensor and is the fastest), but
  for a term whose values are one per-head table shared by every query
  (``AttentionCall.shared_terms``: the offset biases, iRPE's bias mode)
  only on the devices of :data:`SHARED_TERMS_FUSED_ON`, where it was
  measured no slower and no heavier than the dense backend for them.
* CPU (every device but CUDA, and CUDA while ``torch.compile`` traces,
  where free memory cannot be read inside a graph): no gradient into the
  terms and no iRPE on values: SDPA with the terms as a constant mask;
  otherwise ``'explicit'`` below :data:`AUTO_CHUNKED_FROM` tokens and
  ``'chunked'`` from there on.
* CUDA: the dense backend (``'sdpa'`` for the constant mask, else
  ``'explicit'``) while its :func:`memory_estimate` fits in
  :data:`CUDA_MEMORY_FRACTION` of the free device memory; beyond, a backend
  without an ``(L, L)`` tensor: ``'flex'`` where FlexAttention applies and
  no backward runs, else ``'chunked'``. The dense backends are plain
  PyTorch ops (no compilation); the speed of FlexAttention against them on
  CUDA has not been measured by mmpe, so memory decides. Each call reads
  the free memory as it runs: layers that keep ``(L, L)`` probabilities for
  the backward leave less of it to the next ones, which switch once it is
  short.

``'auto'`` never trains with FlexAttention (``flex_ok`` is False where a
backward runs through the call, and ``needs_grad`` rules it out here): in a
run of the CUDA tests on a GPU (PyTorch 2.11) its backward failed to compile
for several iRPE settings (bias tables, the cross method, iRPE on queries,
class tokens), and such a failure comes at the first ``backward()``, after
the forward has run, where no other backend can take over.
``attn_impl='flex'`` asks for it by name.
"""
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..common.tracing import is_tracing
from ..terms.relative_term import split_terms
from .chunked import chunk_rows
from .flex_shapes import padded_length

#: ``attn_impl='auto'`` off CUDA trains with the chunked backend from this
#: many tokens on and with the explicit one below; measured on CPU, see
#: docs/benchmark.md ("Long sequences").
AUTO_CHUNKED_FROM = 1024
#: On CUDA the dense backend runs while its estimated peak is at most this
#: fraction of the free device memory (the rest of the step - later
#: layers, the backward of the other modules - needs the remainder).
CUDA_MEMORY_FRACTION = 0.25
#: Backends :func:`memory_estimate` knows.
ESTIMATED_BACKENDS = ('explicit', 'sdpa', 'chunked', 'flex')
#: Device types where ``'auto'`` runs the fused kernel for terms shared by
#: every query (the offset biases, iRPE's bias mode): measured there no
#: slower and no heavier than ``'explicit'`` in training, one DETR encoder
#: layer (batch 2, 8 heads x 32) at 25 x 42 and 50 x 84, the rows
#: ``mmpe {log-cpb,alibi-2d,lookhere} ({explicit,fused,auto})`` and
#: ``mmpe bias product k [clip-grid] ({explicit,fused})`` of
#: docs/data/attention_broadcast_terms.json (``tools/benchmark/attention.py``;
#: docs/benchmark.md, "Terms shared by every query"). CUDA is not measured
#: yet: there these terms take the dense backend's memory rule.
SHARED_TERMS_FUSED_ON = ('cpu', )


@dataclass(frozen=True)
class AttentionCall:
    """What the rule reads of one call: sizes and modes, not tensors.

    Args:
        length (int): Tokens ``L`` (queries).
        needs_grad (bool): Whether a gradient flows into the relative terms.
        values_term (bool): iRPE on values (needs the probabilities).
        device_type (str): ``'cpu'``, ``'cuda'``...
        batch (int): ``B``.
        heads (int): ``H``.
        head_dim (int): ``d``.
        itemsize (int): Bytes per element of q, k, v.
        logit_terms (int): Relative terms added to the logits.
        dropout (bool): Attention dropout in this call.
        chunk_size (int): The module's ``chunk_size`` (0: automatic).
        keys (int): Keys ``S`` of a cross-attention (0: ``L``, a
            self-attention); the square tensors are ``(B, H, L, S)``.
        shared_terms (bool): A logit term's values are one per-head table
            shared by every query and image (the offset biases, iRPE's
            bias mode: ``RelativeTerm.axis_shared``).
    """
    length: int
    needs_grad: bool
    values_term: bool = False
    device_type: str = 'cpu'
    batch: int = 1
    heads: int = 1
    head_dim: int = 64
    itemsize: int = 4
    logit_terms: int = 1
    dropout: bool = False
    chunk_size: int = 0
    keys: int = 0
    shared_terms: bool = False

    @property
    def key_count(self):
        """``S``: the keys of the call."""
        return self.keys or self.length

    @classmethod
    def of(cls, q: torch.Tensor, needs_grad: bool, terms: Sequence,
           dropout: bool, chunk_size: int = 0,
           keys: int = 0) -> 'AttentionCall':
        """The call of queries ``q`` (B, H, L, d) against ``keys`` keys
        (0: ``L``) with relative ``terms``
        (:class:`~mmpe.models.layers.terms.relative_term.RelativeTerm`)."""
        logits, values = split_terms(terms)
        batch, heads, length, head_dim = q.shape
        return cls(length, needs_grad, bool(values), q.device.type, batch,
                   heads, head_dim, q.element_size(), len(logits), dropout,
                   chunk_size, keys,
                   any(term.axis_shared for term in logits))


def memory_estimate(backend: str, call: AttentionCall) -> int:
    """Bytes a backend holds at the peak of a call on CUDA, beyond what
    every backend holds (q, k, v, the output, the terms' lookups).

    * ``'explicit'``: ``(B, H, L, L)`` buffers. Training: the probabilities
      kept for the backward, where the gradients of the probabilities and
      of the logits join them (the softmax is out of place off CPU): 3;
      with attention dropout one more and its bool mask. Without gradient
      (iRPE on values): logits and probabilities, 2.
    * ``'sdpa'``: the dense terms summed into one ``(B, H, L, L)`` bias
      (two live while a second term is added): 1 or 2; with gradient the
      bias's gradient, one more.
    * ``'chunked'``: two ``(B, H, R, L)`` blocks of ``R`` query rows
      (:func:`~mmpe.models.layers.attention.chunked.chunk_rows`), four with
      dropout.
    * ``'flex'``: no ``(L, L)`` tensor: q, k, v and the output padded to
      the size bucket ``Lp``
      (:mod:`~mmpe.models.layers.attention.flex_shapes`), 4
      ``(B, H, Lp, d)``, and their gradients in training, 8; the row
      log-sum-exp (float32) and the key mask.

    Args:
        backend (str): One of :data:`ESTIMATED_BACKENDS`.
        call (AttentionCall): The call.

    Returns:
        int: Bytes.
    """
    bh, length, item = call.batch * call.heads, call.length, call.itemsize
    square = bh * length * call.key_count
    if backend == 'explicit':
        if not call.needs_grad:
            return 2 * square * item
        if call.dropout:
            return 4 * square * item + square  # + the bool dropout mask
        return 3 * square * item
    if backend == 'sdpa':
        dense = 2 if call.logit_terms > 1 else 1
        return (dense + int(call.needs_grad)) * square * item
    if backend == 'chunked':
        rows = min(length, chunk_rows(bh, call.key_count, call.chunk_size))
        return (4 if call.dropout else 2) * bh * rows * call.key_count * item
    if backend == 'flex':
        padded = padded_length(length)
        copies = 8 if call.needs_grad else 4
        return (copies * bh * padded * call.head_dim * item + bh * padded * 4
                + call.batch * padded)
    raise ValueError(f'Unsupported `backend` {backend!r}, please choose '
                     f'from {ESTIMATED_BACKENDS}')


def auto_backend(call: AttentionCall,
                 flex_ok: bool = False,
                 fused_ok: bool = False,
                 free_bytes: Optional[int] = None,
                 fraction: float = CUDA_MEMORY_FRACTION) -> str:
    """The backend ``attn_impl='auto'`` runs a call with relative terms
    (module docstring).

    Args:
        call (AttentionCall): The call.
        flex_ok (bool): Whether FlexAttention applies to the call (CUDA,
            iRPE on q / k only, no RoPE...). Defaults to False.
        fused_ok (bool): Whether mmpe's fused kernel of the call's device
            (C++ on CPU, Triton on CUDA) applies; for shared terms
            (``call.shared_terms``) it runs on the devices of
            :data:`SHARED_TERMS_FUSED_ON` only. Defaults to False.
        free_bytes (int, optional): Free device memory (CUDA); None: not
            known, the length rule decides. Defaults to None.
        fraction (float): Share of ``free_bytes`` the dense backend may
            take. Defaults to :data:`CUDA_MEMORY_FRACTION`.

    Returns:
        str: ``'fused'``, ``'sdpa'``, ``'explicit'``, ``'chunked'`` or
        ``'flex'``.
    """
    if fused_ok and (not call.shared_terms
                     or call.device_type in SHARED_TERMS_FUSED_ON):
        return 'fused'
    dense = 'explicit' if call.values_term or call.needs_grad else 'sdpa'
    # FlexAttention for inference only (module docstring)
    flex = flex_ok and not call.values_term and not call.needs_grad
    bounded = 'flex' if flex else 'chunked'
    if call.device_type != 'cuda' or free_bytes is None:
        # a cross-attention: the (L, S) tensor of a self-attention's size
        if (dense == 'sdpa'
                or call.length * call.key_count < AUTO_CHUNKED_FROM**2):
            return dense
        return bounded
    if memory_estimate(dense, call) <= fraction * free_bytes:
        return dense
    return bounded


def cuda_free_bytes(device: torch.device) -> Optional[int]:
    """Free memory of a CUDA device: the driver's free memory plus what
    PyTorch's caching allocator holds unused; None off CUDA and while
    tracing (a graph cannot read it)."""
    if device.type != 'cuda' or is_tracing():
        return None
    free, _ = torch.cuda.mem_get_info(device)
    cached = (torch.cuda.memory_reserved(device) -
              torch.cuda.memory_allocated(device))
    return int(free + cached)
