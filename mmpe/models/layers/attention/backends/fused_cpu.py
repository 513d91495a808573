"""mmpe's fused C++ kernel (:mod:`..fused`): logits, per-axis terms, mask
and softmax of a cache-sized block of query rows in one pass; the
``'fused'`` backend on CPU."""
from typing import Optional

from torch import Tensor

from ..fused import FUSED_DTYPES, fused_attention, fused_unavailable_reason
from .base import (AttentionBackend, AttentionRequest, fused_common_reason,
                   register_backend)


@register_backend
class FusedCPUBackend(AttentionBackend):
    """CPU; float32 / float64 / bfloat16 / float16; terms over per-axis
    buckets of a query grid; no attention dropout."""

    name = 'fused-cpu'

    def reason(self, request: AttentionRequest) -> Optional[str]:
        q = request.q
        if q.device.type != 'cpu':
            return f'it runs on CPU, not {q.device.type}'
        for why in (fused_unavailable_reason(), fused_common_reason(request)):
            if why is not None:
                return why
        if q.dtype not in FUSED_DTYPES:
            return f'dtype {q.dtype} is not supported'
        if request.dropout_p > 0:
            return 'attention dropout is not supported'
        if not all(term.axis_query_grid for term in request.terms):
            return ('queries off the grid (cross-attention) are taken by '
                    'the Triton kernel only')
        return None

    def run(self, request: AttentionRequest) -> Tensor:
        r = request
        return fused_attention(r.q_logits, r.k, r.v, r.additive_mask(),
                               [term.axis_values() for term in r.terms])
