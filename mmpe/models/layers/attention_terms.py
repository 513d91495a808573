"""Moved to :mod:`mmpe.models.layers.terms.relative_term` (path kept)."""
from .terms.relative_term import (TERM_KINDS, AxisValues, RelativeTerm, Rows,
                                  build_terms, encode_terms, register_term,
                                  split_terms)
