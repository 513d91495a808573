"""``encoder_pe``: the one config setting for a DETR-family encoder's position
encoding, parsed and checked at build time.

``encoder_pe`` composes an absolute part, added to the encoder's queries and
keys in every layer, with a relative part inside every encoder
self-attention, and says what the decoder's cross-attention keys get::

    encoder_pe = dict(
        absolute='sine',         # 'sine' (mmdet's), 'learnable' or 'none'
        relative=dict(type='irpe', mode='contextual', method='product',
                      ratio=1.9, on='k'),  # or 'rope2d', 'rope-mixed',
                                           # 'log-cpb', 'alibi-2d',
                                           # 'lookhere', None
        decoder_pos='sine')      # 'sine' (mmdet's), 'encoder' or 'none'

- ``absolute``: ``'sine'`` is the detector's own
  ``SinePositionalEncoding`` (``positional_encoding`` keeps its arguments);
  ``'learnable'`` is a learned row/column embedding (DETR's learned variant,
  mmdet's ``LearnedPositionalEncoding``, ``learnable_grid`` rows and columns
  at most); ``'none'`` adds nothing.
- ``relative``: ``None``, a type name, or a dict with ``type`` and that
  type's arguments:

  - ``'irpe'`` (Wu et al., ICCV 2021, Eq. 13-17): the arguments of
    :class:`~mmpe.models.layers.iRPE` (``mode``, ``method``, ``ratio``,
    ``index``, ``shared_head``, ``init``...) and ``on`` (which of q, k, v;
    default ``'k'``);
  - ``'rope2d'`` (axial RoPE, Heo et al., ECCV 2024, Eq. 10-11): ``theta``
    (default 100);
  - ``'rope-mixed'`` (Heo et al., ECCV 2024, Sec. 3.3; learnable per-head
    frequencies, one set per encoder layer): ``theta`` (default 10),
    ``rotate`` (default True);
  - both rotary types also take the token coordinates
    (:mod:`mmpe.models.layers.encodings.rope_coords`): ``coords`` (``'index'``,
    integer token positions, the default; or ``'normalized'``, DINOv3's
    patch centres in ``[-1, 1]`` of each image's valid extent),
    ``normalize`` (``'separate'``, ``'max'`` or ``'min'``), and the
    training-only augmentations ``shift`` (>= 0, default 0), ``jitter``
    and ``rescale`` (>= 1, default 1), e.g.
    ``dict(type='rope-mixed', coords='normalized', normalize='separate',
    shift=0., jitter=1., rescale=2.)``.
- ``decoder_pos``: what the decoder's cross-attention keys (``memory_pos``)
  get: ``'sine'`` (mmdet's default whatever the encoder uses; Conditional
  DETR and DAB-DETR match these keys against sine encodings of their
  reference points), ``'encoder'`` (the encoder's absolute part, zeros for
  ``'none'``; the iRPE paper's "no abs PE" rows of DETR) or ``'none'``.
"""
from typing import Dict, Optional, Tuple, Union

from ...utils.arg_checks import check_int
from ..layers.grid_bias.build import GRID_BIASES, check_bias_cfg
from ..layers.encodings.rope_coords import (COORD_DEFAULTS, ROPE_ARGS,
                                            check_coord_args)

ABSOLUTE_CHOICES = ('sine', 'learnable', 'none')
RELATIVE_CHOICES = ('irpe', 'rope2d', 'rope-mixed') + tuple(GRID_BIASES)
DECODER_POS_CHOICES = ('sine', 'encoder', 'none')
ENCODER_PE_KEYS = ('absolute', 'relative', 'decoder_pos', 'learnable_grid')
#: token-coordinate arguments of both rotary types (``rope_coords.py``)
COORD_ARGS = tuple(COORD_DEFAULTS)


def _choice(field: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f'Unsupported `{field}` {value!r}, please choose '
                         f'from {choices}')


def parse_relative(relative: Union[None, str, Dict]) -> Optional[Dict]:
    """The relative part as a dict with a checked ``type``, or None."""
    if relative is None or relative == 'none':
        return None
    if isinstance(relative, str):
        relative = dict(type=relative)
    if not isinstance(relative, dict) or 'type' not in relative:
        raise ValueError(
            f'Unsupported `encoder_pe.relative` {relative!r}, please give '
            f'None, one of {RELATIVE_CHOICES} or a dict with `type` '
            'from them')
    relative = dict(relative)
    _choice('encoder_pe.relative.type', relative['type'], RELATIVE_CHOICES)
    if relative['type'] in ROPE_ARGS:
        allowed = ROPE_ARGS[relative['type']]
        unknown = sorted(set(relative) - {'type', *allowed})
        if unknown:
            raise ValueError(
                f"Unsupported `encoder_pe.relative` arguments {unknown} for "
                f"type {relative['type']!r}, please choose from {allowed}")
        check_coord_args(
            **rope_coords_cfg(relative), prefix='encoder_pe.relative.')
    elif relative['type'] in GRID_BIASES:
        check_bias_cfg(relative, 'encoder_pe.relative')
    return relative


def rope_coords_cfg(relative: Optional[Dict]) -> Optional[Dict]:
    """The token-coordinate arguments of a parsed rotary relative part
    (defaults filled in), or None when the relative part is not rotary."""
    if relative is None or relative['type'] not in ROPE_ARGS:
        return None
    return {k: relative.get(k, v) for k, v in COORD_DEFAULTS.items()}


def attention_pe_cfg(relative: Optional[Dict], embed_dims: int,
                     num_heads: int) -> Dict:
    """The self-attention config keys (``rpe_cfg``, ``rpe_on``,
    ``rope_cfg``, ``bias_cfg``) for a parsed relative part; checks RoPE's
    head dim at build time."""
    cfg = dict(rpe_cfg=None, rpe_on='k', rope_cfg=None, bias_cfg=None)
    if relative is None:
        return cfg
    kind = relative['type']
    if kind in GRID_BIASES:
        return dict(cfg, bias_cfg=dict(relative))
    if kind == 'irpe':
        rpe_cfg = {k: v for k, v in relative.items() if k not in ('type', 'on')}
        return dict(cfg, rpe_cfg=rpe_cfg, rpe_on=relative.get('on', 'k'))
    head_dim = embed_dims // num_heads
    if head_dim % 4:
        raise ValueError(
            f"Unsupported `encoder_pe.relative.type` {kind!r} with head dim "
            f'{head_dim} (embed_dims {embed_dims} / num_heads {num_heads}): '
            'rotary embeddings need a head dim that is a multiple of 4; '
            'please change num_heads or choose `type` from '
            f"{tuple(c for c in RELATIVE_CHOICES if c not in ROPE_ARGS)}")
    # the coordinates are made once per batch by the detector
    # (RoPECoords), the layers get the positions
    rope_cfg = {k: v for k, v in relative.items() if k not in COORD_ARGS}
    return dict(cfg, rope_cfg=rope_cfg)


def parse_encoder_pe(encoder_pe: Optional[Dict],
                     sine_removed: bool) -> Tuple[str, Optional[Dict], str,
                                                  int]:
    """Check ``encoder_pe``; return ``(absolute, relative, decoder_pos,
    learnable_grid)``.

    Args:
        encoder_pe (dict, optional): The setting (module docstring). None:
            the detector's own (sine in encoder and decoder, the relative
            part from the self-attention config).
        sine_removed (bool): Whether the config says
            ``positional_encoding=None`` (the older spelling of
            ``absolute='none', decoder_pos='encoder'``).
    """
    if encoder_pe is None:
        absolute = 'none' if sine_removed else 'sine'
        return absolute, None, 'encoder', 50
    if sine_removed:
        raise ValueError(
            '`positional_encoding=None` and `encoder_pe` both given; please '
            "say `encoder_pe=dict(absolute='none', decoder_pos='encoder')` "
            'and keep `positional_encoding` (the sine arguments)')
    if not isinstance(encoder_pe, dict):
        raise ValueError(f'Unsupported `encoder_pe` {encoder_pe!r}, please '
                         f'give a dict with keys from {ENCODER_PE_KEYS}')
    unknown = sorted(set(encoder_pe) - set(ENCODER_PE_KEYS))
    if unknown:
        raise ValueError(f'Unsupported `encoder_pe` keys {unknown}, please '
                         f'choose from {ENCODER_PE_KEYS}')
    absolute = encoder_pe.get('absolute', 'sine')
    absolute = 'none' if absolute is None else absolute
    _choice('encoder_pe.absolute', absolute, ABSOLUTE_CHOICES)
    decoder_pos = encoder_pe.get('decoder_pos', 'sine')
    decoder_pos = 'none' if decoder_pos is None else decoder_pos
    _choice('encoder_pe.decoder_pos', decoder_pos, DECODER_POS_CHOICES)
    grid = encoder_pe.get('learnable_grid', 50)
    check_int('encoder_pe.learnable_grid', grid)
    return (absolute, parse_relative(encoder_pe.get('relative')),
            decoder_pos, grid)


#: ``encoder_pe.absolute`` choices of RT-DETR's AIFI (a table of a fixed
#: grid, ``'learnable'``, cannot serve every input size)
AIFI_ABSOLUTE_CHOICES = ('sine', 'none')
#: ``encoder_pe`` keys of RT-DETR's AIFI (its decoder reads the encoder's
#: maps without a position of the keys: no ``decoder_pos``)
AIFI_PE_KEYS = ('absolute', 'relative')


def parse_aifi_pe(encoder_pe: Optional[Dict]) -> Tuple[str, Optional[Dict]]:
    """Check ``encoder_pe`` of RT-DETR's AIFI (the transformer encoder
    layer of its hybrid encoder); return ``(absolute, relative)``.

    The schema is the DETR family's (module docstring) less what AIFI
    cannot use: ``absolute`` is ``'sine'`` (the released 2D sin-cos) or
    ``'none'``; ``relative`` takes every choice of
    :data:`RELATIVE_CHOICES`. None means ``dict(absolute='sine')``.
    """
    if encoder_pe is None:
        return 'sine', None
    if not isinstance(encoder_pe, dict):
        raise ValueError(f'Unsupported `encoder_pe` {encoder_pe!r}, please '
                         f'give a dict with keys from {AIFI_PE_KEYS}')
    unknown = sorted(set(encoder_pe) - set(AIFI_PE_KEYS))
    if unknown:
        raise ValueError(
            f'Unsupported `encoder_pe` keys {unknown} for RT-DETR\'s AIFI '
            '(its decoder attends to the encoder\'s maps without a key '
            f'position), please choose from {AIFI_PE_KEYS}')
    absolute = encoder_pe.get('absolute', 'sine')
    absolute = 'none' if absolute is None else absolute
    if absolute == 'learnable':
        raise ValueError(
            "Unsupported `encoder_pe.absolute` 'learnable' in RT-DETR's "
            'AIFI: a learned table has a fixed largest grid and AIFI runs '
            'at every input size; please choose from '
            f'{AIFI_ABSOLUTE_CHOICES} (with any `encoder_pe.relative`)')
    _choice('encoder_pe.absolute', absolute, AIFI_ABSOLUTE_CHOICES)
    return absolute, parse_relative(encoder_pe.get('relative'))
