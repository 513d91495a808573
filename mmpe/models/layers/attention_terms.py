"""Kept old path (docs name it) of :mod:`.terms` (relative_term, registry)."""
from .terms.registry import (TERM_KINDS, build_terms, encode_terms,
                             register_term)
from .terms.relative_term import AxisValues, RelativeTerm, Rows, split_terms
