"""What every backend of the attention core gets of a call, the interface
a backend implements, and the registry the core chooses from.

A backend is one class in one module of this package, registered with
:func:`register_backend` under its :attr:`AttentionBackend.name`:
:meth:`~AttentionBackend.reason` says why it cannot run a call (None: it
can), :meth:`~AttentionBackend.run` runs it. A backend reads the call only
through :class:`AttentionRequest`, never the attention module that made it.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import torch
from torch import Tensor, nn

from ...common.tracing import is_exporting
from ...terms.relative_term import RelativeTerm, split_terms
from ..backend_rule import AttentionCall
from ..ops import additive_mask


@dataclass
class AttentionRequest:
    """One call of :meth:`~mmpe.models.layers.PEAttention.attend`, after
    RoPE and the relative terms.

    Args:
        q (Tensor): Queries (B, H, Q, d), rotated where RoPE is on, not
            scaled.
        k (Tensor): Keys (B, H, L, d), rotated alike.
        v (Tensor): Values (B, H, L, dv).
        scale (float): The logits' scale ``1 / sqrt(d)``.
        terms (list[RelativeTerm]): The call's relative terms (logit terms,
            then value terms); empty: plain attention.
        q_logits (Tensor, optional): The scaled queries of the logits (the
            very tensor the terms read where RoPE is off, so that it is kept
            once for the backward); None without terms.
        height (int): Grid height (0 without terms).
        width (int): Grid width.
        attn_mask (Tensor, optional): (Q, L) bool or additive float mask.
        key_padding_mask (Tensor, optional): (B, L) bool, True at padding.
        dropout_p (float): Attention dropout of this call (0 in eval mode).
        chunk_size (int): Query rows per chunk (0: automatic).
        has_rope (bool): Whether RoPE rotated q and k.
        flex_rpe (tuple): iRPE modules on keys and queries, for
            FlexAttention's ``score_mod`` (which reads their tables and index
            plans; None, None: none).
        flex_failed (set): (device type, dtype) pairs FlexAttention failed to
            compile for in this attention module (the flex backend adds to
            it; owned by the module, so that a failure is not retried).
        uses_rel_pos (bool): Whether the terms include the decomposed
            relative position (FlexAttention does not read it).
    """
    q: Tensor
    k: Tensor
    v: Tensor
    scale: float
    terms: List[RelativeTerm] = field(default_factory=list)
    q_logits: Optional[Tensor] = None
    height: int = 0
    width: int = 0
    attn_mask: Optional[Tensor] = None
    key_padding_mask: Optional[Tensor] = None
    dropout_p: float = 0.0
    chunk_size: int = 0
    has_rope: bool = False
    flex_rpe: Tuple[Optional[nn.Module], Optional[nn.Module]] = (None, None)
    flex_failed: Set[Tuple[str, torch.dtype]] = field(default_factory=set)
    uses_rel_pos: bool = False

    @property
    def needs_grad(self) -> bool:
        """Whether a gradient flows into the relative terms."""
        return torch.is_grad_enabled() and any(
            x.requires_grad for term in self.terms for x in term.tensors)

    @property
    def backward(self) -> bool:
        """Whether a backward runs through q, k or v."""
        return torch.is_grad_enabled() and any(
            x.requires_grad for x in (self.q, self.k, self.v))

    @property
    def values_terms(self) -> List[RelativeTerm]:
        """The terms added to the output (iRPE on values)."""
        return split_terms(self.terms)[1]

    def call(self) -> AttentionCall:
        """The sizes and modes the ``'auto'`` rule reads."""
        return AttentionCall.of(self.q, self.needs_grad, self.terms,
                                self.dropout_p > 0, self.chunk_size,
                                self.k.shape[2])

    def additive_mask(self) -> Optional[Tensor]:
        """Key padding and ``attn_mask`` as one additive float mask
        broadcastable to (B, H, Q, L), or None."""
        return additive_mask(self.attn_mask, self.key_padding_mask, self.q)


class AttentionBackend:
    """A way to compute a call of the attention core.

    Subclasses set :attr:`name` and implement :meth:`run`; :meth:`reason`
    refuses what they do not take.
    """

    #: registry name (``attn_impl`` names some of them)
    name: str = ''

    def reason(self, request: AttentionRequest) -> Optional[str]:
        """Why this backend cannot run the call, or None."""
        return None

    def run(self, request: AttentionRequest) -> Tensor:
        """The output (B, H, Q, dv). Raises :class:`BackendFailed` where
        the call failed in a way another backend can take over (a
        compilation)."""
        raise NotImplementedError


class BackendFailed(RuntimeError):
    """A backend could not run a call it took (e.g. its compilation
    failed); the message says why, the core runs another backend."""


#: name -> the backend (one instance each; backends keep no state)
ATTENTION_BACKENDS: Dict[str, AttentionBackend] = {}


def register_backend(cls: type) -> type:
    """Class decorator: registers one instance under ``cls.name``."""
    if not cls.name or cls.name in ATTENTION_BACKENDS:
        raise ValueError(f'backend name {cls.name!r} is empty or taken; '
                         f'registered: {sorted(ATTENTION_BACKENDS)}')
    ATTENTION_BACKENDS[cls.name] = cls()
    return cls


def fused_common_reason(request: AttentionRequest) -> Optional[str]:
    """What neither fused kernel (C++, Triton) takes, or None: an exported
    graph (standard ops only), terms that are not per-axis buckets, one per
    role."""
    if is_exporting():
        return 'exported graphs hold standard ops only'
    terms = request.terms
    if any(term.axis_layout is None for term in terms) or len(
            {term.axis_on for term in terms}) != len(terms):
        return ('it takes terms over per-axis buckets, one per role (iRPE '
                'product / cross on queries, keys and values, the decomposed '
                'relative position, the offset biases, BoxRPB)')
    return None
