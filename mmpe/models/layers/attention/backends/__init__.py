"""The backends of the attention core, one module each, behind one
interface (:class:`~.base.AttentionBackend`: why it cannot run a call, or
None; run the call), chosen through a registry
(:data:`~.base.ATTENTION_BACKENDS`) by :func:`~.choice.attend`.

=============  ===========================================================
``sdpa``       PyTorch's fused attention, the terms as its float mask
``explicit``   (B, H, Q, L) logits, softmax, autograd's backward
``chunked``    blocks of query rows, a recomputing backward (custom op)
``fused-cpu``  mmpe's C++ kernel (``attn_impl='fused'`` on CPU)
``fused-cuda`` mmpe's Triton kernel (``attn_impl='fused'`` on CUDA)
``flex``       FlexAttention with iRPE in a ``score_mod``
=============  ===========================================================
"""
from . import chunked, explicit, flex, fused_cpu, fused_cuda, sdpa  # noqa
from .base import (ATTENTION_BACKENDS, AttentionBackend, AttentionRequest,
                   BackendFailed, register_backend)
from .choice import FALLBACKS, attend, fused_backend, select_backend

__all__ = [
    'ATTENTION_BACKENDS', 'AttentionBackend', 'AttentionRequest',
    'BackendFailed', 'register_backend', 'FALLBACKS', 'attend',
    'fused_backend', 'select_backend'
]
