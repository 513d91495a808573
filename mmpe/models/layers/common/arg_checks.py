"""Argument checks shared by mmpe's position-encoding layers.

Every user-facing configuration error is a ``ValueError`` naming the field,
the value and the valid choices (integers: :func:`mmpe.utils.arg_checks.check_int`,
the one integer check of the package).
"""
import operator
from typing import Tuple

import torch

#: Where iRPE can go inside one attention.
RPE_ON_CHOICES = ('q', 'k', 'v', 'qk', 'kv', 'qv', 'qkv')
#: How an attention computes (see :class:`~mmpe.models.layers.PEAttention`).
ATTN_IMPL_CHOICES = ('auto', 'explicit', 'chunked', 'fused', 'sdpa', 'flex')


def check_choice(name: str, value, choices: tuple) -> None:
    """Raise unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f'Unsupported `{name}` {value!r}, please choose from '
                         f'{choices}')


def check_grid(height: int, width: int) -> Tuple[int, int]:
    """Validate a grid size; accepts any integer type (e.g. numpy ints).

    Python and symbolic ints (``torch.SymInt``, while a graph is traced with
    dynamic shapes) are returned as they are: ``operator.index`` of a
    symbolic size would freeze the graph at that size.
    """
    out = []
    for name, value in (('height', height), ('width', width)):
        if isinstance(value, (int, torch.SymInt)) and not isinstance(
                value, bool):
            ok = value > 0
        else:
            try:
                ok = not isinstance(value, bool) and operator.index(value) > 0
                value = operator.index(value)
            except TypeError:
                ok = False
        if not ok:
            raise ValueError(
                f'Unsupported `{name}` {value!r}, please choose an int > 0')
        out.append(value)
    return out[0], out[1]
