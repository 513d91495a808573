"""The plain ViT's position encodings by name, and how they compose.

The vocabulary of ``CPVT(pos_encoding=...)``, shared by the backbone
(:mod:`mmpe.models.backbones.vit_args` checks the rest of its arguments) and
the weight converters that map other ViTs onto it
(:mod:`mmpe.models.utils.timm_vit`). A pure function: it returns the names
normalised or raises a ``ValueError`` naming the value and the choices.
"""
from typing import Sequence, Tuple, Union

#: Every position encoding of the backbone, by the place it acts.
ABSOLUTE_ENCODINGS = ('learnable', 'sine')
ATTENTION_ENCODINGS = ('rope2d', 'rope-mixed', 'irpe', 'rel-pos', 'log-cpb',
                       'alibi-2d', 'lookhere')
#: The per-head biases of the grid offset among them (``bias_cfg``)
BIAS_ENCODINGS = ('log-cpb', 'alibi-2d', 'lookhere')
POS_ENCODINGS = ('peg', 'none') + ABSOLUTE_ENCODINGS + ATTENTION_ENCODINGS


def parse_pos_encoding(
        pos_encoding: Union[str, Sequence[str]]) -> Tuple[str, ...]:
    """Normalise ``pos_encoding`` to a tuple of encodings that compose.

    One name, or a list composing at most one absolute encoding
    (:data:`ABSOLUTE_ENCODINGS`), ``'peg'``, and at most one encoding inside
    attention (:data:`ATTENTION_ENCODINGS`); e.g. the iRPE authors' DeiT is
    ``('learnable', 'irpe')``. ``'none'`` stands alone and gives ``()``.
    """
    names = (pos_encoding, ) if isinstance(pos_encoding, str) else pos_encoding
    if not isinstance(names, (list, tuple)) or not names:
        raise ValueError(f'Unsupported `pos_encoding` {pos_encoding!r}, '
                         f'please choose from {POS_ENCODINGS} or a list of '
                         'them')
    for name in names:
        if name not in POS_ENCODINGS:
            raise ValueError(f'Unsupported `pos_encoding` entry {name!r}, '
                             f'please choose from {POS_ENCODINGS}')
    if len(set(names)) != len(names):
        raise ValueError(f'`pos_encoding` {pos_encoding!r} names an encoding '
                         'twice')
    if 'none' in names:
        if len(names) > 1:
            raise ValueError(f"`pos_encoding` {pos_encoding!r}: 'none' "
                             'cannot be combined with other encodings')
        return ()
    for group in (ABSOLUTE_ENCODINGS, ATTENTION_ENCODINGS):
        if len([n for n in names if n in group]) > 1:
            raise ValueError(
                f'`pos_encoding` {pos_encoding!r} combines more than one of '
                f'{group}; choose one of them')
    return tuple(names)
