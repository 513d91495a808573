"""Relative terms by ``kind``: the registry, and a call's terms through
the arguments of a custom op.

A term (:class:`~mmpe.models.layers.terms.relative_term.RelativeTerm`) is
described by a JSON-able ``spec()`` and rebuilt by :func:`build_terms` from
it, its tensors and the grid, so that the chunked backend can run as one
opaque ``torch.library`` custom op (whose arguments are tensors, numbers and
strings) inside a compiled graph. A term class is registered under its
``kind`` with :func:`register_term`; a compiled graph names terms by
their kinds and specs, so these do not change.
"""
import functools
import json
from typing import Dict, List, Sequence, Tuple, Type

from torch import Tensor

from .relative_term import RelativeTerm

#: ``kind`` -> term class, see :func:`register_term`
TERM_KINDS: Dict[str, Type['RelativeTerm']] = {}


def register_term(cls: Type['RelativeTerm']) -> Type['RelativeTerm']:
    """Class decorator: make ``cls`` buildable from its spec by ``kind``."""
    if cls.kind in TERM_KINDS and TERM_KINDS[cls.kind] is not cls:
        raise ValueError(f'relative term kind {cls.kind!r} is registered '
                         f'twice ({TERM_KINDS[cls.kind]} and {cls})')
    TERM_KINDS[cls.kind] = cls
    return cls


def encode_terms(terms: Sequence[RelativeTerm]) -> Tuple[str, List[Tensor]]:
    """Terms -> (a JSON string, their tensors in order), for a custom op."""
    spec = ','.join(f'["{t.kind}",{t.spec_json()},{len(t.tensors)}]'
                    for t in terms)
    return f'[{spec}]', [x for t in terms for x in t.tensors]


@functools.lru_cache(maxsize=64)
def _decode(spec: str) -> Tuple[Tuple[str, dict, int], ...]:
    return tuple((kind, cfg, n) for kind, cfg, n in json.loads(spec))


def build_terms(spec: str, tensors: Sequence[Tensor], height: int,
                width: int, length: int) -> List[RelativeTerm]:
    """The inverse of :func:`encode_terms` for one call's grid."""
    terms, pos = [], 0
    for kind, cfg, n in _decode(spec):
        if kind not in TERM_KINDS:
            raise ValueError(f'Unknown relative term kind {kind!r}, '
                             f'registered: {tuple(TERM_KINDS)}')
        terms.append(TERM_KINDS[kind](cfg, tensors[pos:pos + n], height,
                                      width, length))
        pos += n
    return terms
