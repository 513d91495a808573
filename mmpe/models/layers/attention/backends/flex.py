"""FlexAttention (:mod:`..flex`): iRPE on queries / keys in a compiled
``score_mod``; inference on CUDA under ``'auto'``, any call it takes by
name."""
from typing import Optional

import torch
from torch import Tensor

from ..flex import FLEX_DTYPES, flex_unsupported_reason, irpe_flex_attention
from .base import (AttentionBackend, AttentionRequest, BackendFailed,
                   register_backend)


@register_backend
class FlexBackend(AttentionBackend):
    """iRPE on queries and / or keys only (its ``score_mod`` reads the iRPE
    modules' tables and index plans: ``request.flex_rpe``); no RoPE, no
    ``attn_mask``, no attention dropout; float32 / bfloat16 / float16; a
    backward only where FlexAttention compiles one for the device."""

    name = 'flex'

    def reason(self, request: AttentionRequest) -> Optional[str]:
        r, q = request, request.q
        rpe_k, rpe_q = r.flex_rpe
        if r.has_rope:
            return 'RoPE is not supported'
        if r.uses_rel_pos:
            return 'the decomposed relative position is not supported'
        if rpe_k is None and rpe_q is None:
            return 'no iRPE on queries or keys'
        if r.values_terms:
            return 'iRPE on values needs the attention probabilities'
        if len(r.terms) != (rpe_k is not None) + (rpe_q is not None):
            return 'only the iRPE terms of the module are supported'
        if r.attn_mask is not None:
            return '`attn_mask` is not supported'
        if r.dropout_p > 0:
            return 'attention dropout is not supported'
        if q.dtype not in FLEX_DTYPES:
            return f'dtype {q.dtype} is not supported'
        if (q.device.type, q.dtype) in r.flex_failed:
            return f'compilation failed before on {q.device.type}'
        requires_grad = torch.is_grad_enabled() and (r.backward or any(
            rpe.table.requires_grad for rpe in r.flex_rpe if rpe is not None))
        return flex_unsupported_reason(q.device, requires_grad)

    def run(self, request: AttentionRequest) -> Tensor:
        r = request
        try:
            return irpe_flex_attention(r.q.contiguous(), r.k.contiguous(),
                                       r.v.contiguous(), r.height, r.width,
                                       *r.flex_rpe, r.key_padding_mask,
                                       r.scale)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # compilation (no compiler, inductor bug)
            r.flex_failed.add((r.q.device.type, r.q.dtype))
            raise BackendFailed(
                f'FlexAttention failed on {r.q.device.type} '
                f'({type(e).__name__}: {str(e)[:200]})') from e
