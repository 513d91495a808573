"""The chunked backend: the explicit steps on blocks of query rows with a
backward that recomputes each block (the custom op ``mmpe::attention`` of
:mod:`..chunked`): exact, no (B, H, Q, L) tensor kept; any term, any
device, attention dropout."""
from torch import Tensor

from ..chunked import relative_attention
from .base import AttentionBackend, AttentionRequest, register_backend


@register_backend
class ChunkedBackend(AttentionBackend):
    """Any call with relative terms."""

    name = 'chunked'

    def run(self, request: AttentionRequest) -> Tensor:
        r = request
        return relative_attention(r.q_logits, r.k, r.v, r.additive_mask(),
                                  r.terms, r.height, r.width, r.chunk_size,
                                  dropout_p=r.dropout_p)
