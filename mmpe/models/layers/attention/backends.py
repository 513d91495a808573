"""The backends of the attention core: which one runs a call, and how.

:class:`AttentionBackends` is the part of
:class:`~mmpe.models.layers.PEAttention` that knows its backends
(``attn_impl``, described there): :meth:`~AttentionBackends.select_backend`
(the named backend, or the ``'auto'`` rule of
:mod:`~mmpe.models.layers.attention.backend_rule`), why the fused CPU kernel
or FlexAttention does not apply to a call (the reason is the warning of the
fallback, once per module), and the calls of the explicit, SDPA and flex
backends; the chunked and fused ones are custom ops of their own modules.
"""
import warnings
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common.tracing import is_exporting
from ..terms.relative_term import RelativeTerm, split_terms
from .backend_rule import AttentionCall, auto_backend
from .flex import FLEX_DTYPES, flex_unsupported_reason, irpe_flex_attention
from .fused import FUSED_DTYPES, fused_unavailable_reason
from .fused_triton import (MAX_HEAD_DIM, TRITON_DTYPES,
                           triton_unavailable_reason)
from .ops import additive_mask, attention_probs, constant_bias


class AttentionBackends:
    """The backends of :class:`~mmpe.models.layers.PEAttention`, mixed
    into it.

    Reads the module's ``attn_impl``, ``attn_drop_prob``, ``training``,
    ``rpe_q`` / ``rpe_k`` / ``rpe_v``, ``rel_pos`` and
    :attr:`has_relative_terms`; keeps the messages it warned about
    (``_warned``) and the (device type, dtype) pairs FlexAttention failed
    to compile for (``_flex_failed``), both sets made in ``__init__``.
    """

    def select_backend(self,
                       length: int,
                       needs_grad: bool,
                       flex_ok: bool = False,
                       impl: Optional[str] = None,
                       fused_ok: bool = False,
                       call: Optional[AttentionCall] = None,
                       free_bytes: Optional[int] = None) -> str:
        """The backend that runs a call: ``impl`` (None: ``attn_impl``);
        'auto':
        :func:`~mmpe.models.layers.attention.backend_rule.auto_backend` of
        ``call`` (None: ``length`` and ``needs_grad`` on CPU), ``flex_ok``,
        ``fused_ok`` (``_fused_reason`` is None) and ``free_bytes`` (CUDA).
        ``needs_grad``: a gradient flows into the relative terms.
        Returns ``'sdpa'``, ``'explicit'``, ``'chunked'``, ``'fused'`` or
        ``'flex'``."""
        impl = self.attn_impl if impl is None else impl
        if not self.has_relative_terms:
            return 'sdpa'
        if impl == 'fused':
            return 'fused' if fused_ok else 'chunked'
        if impl in ('sdpa', 'flex', 'chunked'):
            return impl
        if call is None:
            call = AttentionCall(length, needs_grad, self.rpe_v is not None)
        if impl == 'explicit':
            return 'explicit' if needs_grad or call.values_term else 'sdpa'
        return auto_backend(call, flex_ok, fused_ok, free_bytes)


    def _dropout_p(self) -> float:
        return self.attn_drop_prob if self.training else 0.0

    def _explicit(self, qs: Tensor, k: Tensor, v: Tensor,
                  terms: List[RelativeTerm],
                  mask: Optional[Tensor]) -> Tensor:
        """(B, H, L, L) logits of the scaled queries ``qs`` with the terms
        added in place, softmax, and the value terms; autograd's
        backward."""
        logit_terms, value_terms = split_terms(terms)
        attn = attention_probs(qs, k, logit_terms, mask)
        drop = self._dropout_p()
        if drop > 0:
            attn = F.dropout(attn, drop, True)
        out = attn @ v  # (B, H, L, head_dims)
        for term in value_terms:
            out = out + term.out_rows(attn, None)
        return out

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor,
              terms: List[RelativeTerm], attn_mask: Optional[Tensor],
              key_padding_mask: Optional[Tensor], scale: float,
              needs_grad: bool) -> Tensor:
        """The logit terms and masks as the float mask of SDPA."""
        dense = [term.dense() for term in terms]
        mask = additive_mask(attn_mask, key_padding_mask, q)
        if needs_grad:
            # out of place: autograd forbids in-place adds to the views the
            # iRPE expansion returns
            bias = mask
            for term, _ in dense:
                bias = term if bias is None else bias + term
        else:
            bias = constant_bias(dense, mask)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=self._dropout_p(),
            scale=scale)

    def _flex(self, q: Tensor, k: Tensor, v: Tensor,
              attn_mask: Optional[Tensor],
              key_padding_mask: Optional[Tensor], scale: float, height: int,
              width: int, has_rope: bool) -> Optional[Tensor]:
        """The fused path, or None (with a warning) where it does not apply.
        """
        reason = self._flex_reason(q, k, v, attn_mask)
        if has_rope:
            reason = 'RoPE is not supported'
        if reason is None:
            try:
                return irpe_flex_attention(q.contiguous(), k.contiguous(),
                                           v.contiguous(), height, width,
                                           self.rpe_k, self.rpe_q,
                                           key_padding_mask, scale)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # compilation (no compiler, inductor bug)
                self._flex_failed.add((q.device.type, q.dtype))
                reason = (f'FlexAttention failed on {q.device.type} '
                          f'({type(e).__name__}: {str(e)[:200]})')
        fallback = 'chunked' if self.attn_impl == 'auto' else 'explicit'
        self._warn_once(f"{type(self).__name__} attn_impl="
                        f"{self.attn_impl!r} falls back to the {fallback} "
                        f'backend: {reason}')
        return None

    def _flex_reason(self, q: Tensor, k: Tensor, v: Tensor,
                     attn_mask: Optional[Tensor]) -> Optional[str]:
        """Why the fused path does not apply to this call, or None."""
        if self.rel_pos is not None:
            return 'the decomposed relative position is not supported'
        if self.rpe_k is None and self.rpe_q is None:
            return 'no iRPE on queries or keys'
        if self.rpe_v is not None:
            return 'iRPE on values needs the attention probabilities'
        if attn_mask is not None:
            return '`attn_mask` is not supported'
        if self.training and self.attn_drop_prob > 0:
            return 'attention dropout is not supported'
        if q.dtype not in FLEX_DTYPES:
            return f'dtype {q.dtype} is not supported'
        if (q.device.type, q.dtype) in self._flex_failed:
            return f'compilation failed before on {q.device.type}'
        requires_grad = torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad or any(
                rpe.table.requires_grad
                for rpe in (self.rpe_k, self.rpe_q) if rpe is not None))
        return flex_unsupported_reason(q.device, requires_grad)

    def _fused_reason(self, q: Tensor,
                      terms: Sequence[RelativeTerm]) -> Optional[str]:
        """Why the fused kernel of ``q``'s device (C++ on CPU, Triton on
        CUDA) does not apply to this call, or None."""
        if is_exporting():
            return 'exported graphs hold standard ops only'
        if self.training and self.attn_drop_prob > 0:
            return 'attention dropout is not supported'
        if any(term.axis_layout is None for term in terms) or len(
                {term.axis_on for term in terms}) != len(terms):
            return ('it takes terms over per-axis buckets, one per role '
                    '(iRPE product / cross on queries, keys and values, the '
                    'decomposed relative position, BoxRPB)')
        if q.device.type == 'cuda':
            reason = triton_unavailable_reason(q.device)
            if reason is None and q.dtype not in TRITON_DTYPES:
                reason = (f'dtype {q.dtype} is not supported (Triton kernel: '
                          f'{", ".join(map(str, TRITON_DTYPES))})')
            if reason is None and q.shape[-1] > MAX_HEAD_DIM:
                reason = (f'head dim {q.shape[-1]} is above the Triton '
                          f"kernel's {MAX_HEAD_DIM}")
            return reason
        if q.device.type != 'cpu':
            return f'it runs on CPU and CUDA, not {q.device.type}'
        reason = fused_unavailable_reason()
        if reason is None and q.dtype not in FUSED_DTYPES:
            reason = f'dtype {q.dtype} is not supported'
        if reason is None and not all(term.axis_query_grid
                                      for term in terms):
            reason = ('queries off the grid (cross-attention) are taken by '
                      'the Triton kernel only')
        return reason

    def _warn_once(self, msg: str) -> None:
        if msg not in self._warned:
            self._warned.add(msg)
            warnings.warn(msg, stacklevel=4)
