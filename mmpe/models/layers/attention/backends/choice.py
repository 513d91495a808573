"""Which backend runs a call: the named one (``attn_impl``), or the rule of
``'auto'`` (:func:`~..backend_rule.auto_backend`); the fallbacks, each with
a warning that names why."""
from typing import Callable, Optional

from torch import Tensor

from ...common.tracing import is_exporting
from ..backend_rule import AttentionCall, auto_backend, cuda_free_bytes
from .base import ATTENTION_BACKENDS, AttentionRequest, BackendFailed

#: What a named backend falls back to where it does not apply
FALLBACKS = {'fused': 'chunked', 'flex': 'explicit'}


def fused_backend(device_type: str) -> str:
    """The registry name of ``'fused'`` on a device: the Triton kernel on
    CUDA, the C++ kernel elsewhere."""
    return 'fused-cuda' if device_type == 'cuda' else 'fused-cpu'


def select_backend(impl: str, call: AttentionCall, flex_ok: bool = False,
                   fused_ok: bool = False,
                   free_bytes: Optional[int] = None) -> str:
    """The backend of a call with relative terms, from its sizes: ``impl``
    where it applies ('fused' where ``fused_ok``, else 'chunked'; 'explicit'
    becomes SDPA where neither a gradient nor a value term needs the
    probabilities), else the ``'auto'`` rule. Returns ``'sdpa'``,
    ``'explicit'``, ``'chunked'``, ``'fused'`` or ``'flex'``."""
    if impl == 'fused':
        return 'fused' if fused_ok else FALLBACKS['fused']
    if impl in ('sdpa', 'flex', 'chunked'):
        return impl
    if impl == 'explicit':
        return 'explicit' if call.needs_grad or call.values_term else 'sdpa'
    return auto_backend(call, flex_ok, fused_ok, free_bytes)


def attend(request: AttentionRequest, impl: str,
           warn: Callable[[str], None], who: str = 'attention') -> Tensor:
    """Run ``request`` (:class:`AttentionRequest`) with the backend
    ``impl`` (an ``attn_impl`` choice) or, where it does not apply, its
    fallback; ``warn(message)`` tells why (the caller warns once per
    message), ``who`` names the module in the message."""
    backends = ATTENTION_BACKENDS
    if not request.terms:  # no relative term: PyTorch's fused kernel
        return backends['sdpa'].run(request)
    device = request.q.device.type
    if impl == 'flex':
        out = _try_flex(request, impl, warn, who)
        if out is not None:
            return out
        impl = FALLBACKS['flex']
    if impl in ('chunked', 'fused') and is_exporting():
        impl = 'explicit'  # exported graphs hold standard ops only
    fused = backends[fused_backend(device)]
    fused_reason = fused.reason(request)
    if impl == 'fused' and fused_reason is not None:
        warn(f"{who} attn_impl='fused' falls back to the chunked backend: "
             f'{fused_reason}')
    # 'auto' takes FlexAttention only where no backward runs through it
    # (frozen tables included): backend_rule's docstring says why
    flex_ok = (device == 'cuda' and not request.backward
               and backends['flex'].reason(request) is None)
    name = select_backend(
        impl, request.call(), flex_ok, fused_reason is None,
        cuda_free_bytes(request.q.device) if impl == 'auto' else None)
    if impl == 'auto' and name == 'chunked' and device == 'cuda':
        why = fused_reason or ('not chosen for terms shared by every query '
                               'on this device (backend_rule.'
                               'SHARED_TERMS_FUSED_ON)')
        warn(f"{who} attn_impl='auto' runs the chunked backend (the dense "
             f'one does not fit in memory; the fused kernel: {why})')
    if name == 'flex':  # 'auto' on CUDA, inference
        out = _try_flex(request, impl, warn, who)
        if out is not None:
            return out
        name = 'chunked'
    if name == 'fused':
        return fused.run(request)
    return backends[name].run(request)


def _try_flex(request: AttentionRequest, impl: str,
              warn: Callable[[str], None], who: str) -> Optional[Tensor]:
    """FlexAttention's output, or None (with a warning) where it does not
    apply or does not compile."""
    flex = ATTENTION_BACKENDS['flex']
    reason = flex.reason(request)
    if reason is None:
        try:
            return flex.run(request)
        except BackendFailed as e:
            reason = str(e)
    fallback = 'chunked' if impl == 'auto' else FALLBACKS['flex']
    warn(f'{who} attn_impl={impl!r} falls back to the {fallback} backend: '
         f'{reason}')
    return None
