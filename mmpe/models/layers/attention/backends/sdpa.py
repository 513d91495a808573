"""PyTorch's fused attention (``F.scaled_dot_product_attention``), the
relative terms as its float mask: the calls without terms, and inference
(the terms a constant mask, :func:`~..ops.constant_bias`)."""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from ..ops import constant_bias
from .base import AttentionBackend, AttentionRequest, register_backend


@register_backend
class SDPABackend(AttentionBackend):
    """``softmax(q k^T * scale + sum_t T^t + m) v`` by SDPA; the logit
    terms materialised as (B, H, Q, L) (with their gradient where one
    flows); no term on values (it needs the probabilities)."""

    name = 'sdpa'

    def reason(self, request: AttentionRequest) -> Optional[str]:
        if request.values_terms:
            return 'iRPE on values needs the attention probabilities'
        return None

    def run(self, request: AttentionRequest) -> Tensor:
        mask = request.additive_mask()
        dense = [term.dense() for term in request.terms]
        if request.needs_grad:
            # out of place: autograd forbids in-place adds to the views the
            # iRPE expansion returns
            bias = mask
            for term, _ in dense:
                bias = term if bias is None else bias + term
        else:
            bias = constant_bias(dense, mask)
        return F.scaled_dot_product_attention(
            request.q, request.k, request.v, attn_mask=bias,
            dropout_p=request.dropout_p, scale=request.scale)
