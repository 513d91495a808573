"""The explicit backend: (B, H, Q, L) logits with the relative terms added
in place, softmax, ``@ v`` and the value terms, kept for autograd's
backward (the reference of every other backend)."""
import torch
import torch.nn.functional as F
from torch import Tensor

from ...common.tracing import is_exporting, is_tracing
from ...terms.relative_term import split_terms
from ..chunked import relative_attention
from ..ops import attention_probs
from .base import AttentionBackend, AttentionRequest, register_backend


@register_backend
class ExplicitBackend(AttentionBackend):
    """Any call. While ``torch.compile`` traces a training step it runs as
    the custom op ``mmpe::attention`` with the probabilities saved (the
    eager in-place kernels inside the compiled graph)."""

    name = 'explicit'

    def run(self, request: AttentionRequest) -> Tensor:
        r = request
        mask = r.additive_mask()
        if (is_tracing() and not is_exporting() and torch.is_grad_enabled()
                and (r.needs_grad or r.backward)):
            return relative_attention(r.q_logits, r.k, r.v, mask, r.terms,
                                      r.height, r.width, save_probs=True,
                                      dropout_p=r.dropout_p)
        logit_terms, value_terms = split_terms(r.terms)
        # a separate product, as always (shared with the terms, autograd
        # would sum the gradients of q in another order)
        attn = attention_probs(r.q * r.scale, r.k, logit_terms, mask)
        if r.dropout_p > 0:
            attn = F.dropout(attn, r.dropout_p, True)
        out = attn @ r.v
        for term in value_terms:
            out = out + term.out_rows(attn, None)
        return out
