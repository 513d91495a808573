"""mmpe's fused Triton kernel (:mod:`..fused_triton`): flash attention with
the per-axis terms read inside the tile; the ``'fused'`` backend on CUDA
(and on CPU tensors in Triton's interpreter)."""
from typing import Optional

from torch import Tensor

from ..fused_triton import (MAX_HEAD_DIM, TRITON_DTYPES, triton_attention,
                            triton_unavailable_reason)
from ..triton_launch import MAX_SKIP
from .base import (AttentionBackend, AttentionRequest, fused_common_reason,
                   register_backend)


@register_backend
class FusedCUDABackend(AttentionBackend):
    """CUDA; float32 / bfloat16 / float16; head dims up to
    :data:`~..fused_triton.MAX_HEAD_DIM`; terms over per-axis buckets (of a
    query grid, or of the keys only: BoxRPB); attention dropout inside the
    kernel."""

    name = 'fused-cuda'

    def reason(self, request: AttentionRequest) -> Optional[str]:
        q = request.q
        for why in (triton_unavailable_reason(q.device),
                    fused_common_reason(request)):
            if why is not None:
                return why
        if q.dtype not in TRITON_DTYPES:
            return (f'dtype {q.dtype} is not supported (Triton kernel: '
                    f'{", ".join(map(str, TRITON_DTYPES))})')
        if max(q.shape[-1], request.v.shape[-1]) > MAX_HEAD_DIM:
            return (f'head dim {max(q.shape[-1], request.v.shape[-1])} is '
                    f"above the Triton kernel's {MAX_HEAD_DIM}")
        skip = request.k.shape[2] - request.height * request.width
        if request.terms and skip > MAX_SKIP:
            return (f'{skip} leading (class) tokens are more than the Triton '
                    f"kernel's {MAX_SKIP}")
        return None

    def run(self, request: AttentionRequest) -> Tensor:
        r = request
        return triton_attention(r.q_logits, r.k, r.v, r.additive_mask(),
                                [term.axis_values() for term in r.terms],
                                r.dropout_p)
