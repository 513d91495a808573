"""``decoder_pe``: the config setting for a relative position bias in a
DETR-family decoder's cross-attention, parsed and checked at build time.

Box-to-pixel relative position bias (BoxRPB; Lin et al., "DETR Doesn't Need
Multi-Scale or Locality Design", ICCV 2023, Sec. 3.2)::

    decoder_pe = dict(
        type='box-rpb',      # 'box-rpb' (reference boxes, DAB-DETR) or
                             # 'point-rpb' (reference points, Conditional
                             # DETR; DAB-DETR's box centres)
        hidden=512,          # hidden channels of each per-axis MLP
        offsets='linear',    # 'linear' (pixels) or 'log8'
        stride=32,           # pixels per cell of the key grid
        shared=False,        # one pair of MLPs for all layers (True) or
                             # one per layer
        attn_impl='auto',    # the attention core's backend
        chunk_size=None)     # query rows per chunk of 'chunked'

``None`` (the default) leaves the detector's decoder as mmdet builds it.
"""
from typing import Dict, Optional, Union

from ...utils.arg_checks import check_int
from ..layers.attention.cross import CROSS_IMPL_CHOICES
from ..layers.box.box_rpb import RPB_OFFSETS

DECODER_PE_TYPES = ('box-rpb', 'point-rpb')
DECODER_PE_DEFAULTS = dict(
    hidden=512,
    offsets='linear',
    stride=32,
    shared=False,
    attn_impl='auto',
    chunk_size=None)


def parse_decoder_pe(decoder_pe: Union[None, str, Dict],
                     allowed_types: tuple) -> Optional[Dict]:
    """``decoder_pe`` checked and completed with its defaults.

    Args:
        decoder_pe (None | str | dict): The setting (a str: the type).
        allowed_types (tuple[str]): The types the detector's references
            support (boxes: both; points: ``'point-rpb'``).

    Returns:
        dict | None: ``type``, ``mode`` (``'box'`` / ``'point'``) and every
        key of :data:`DECODER_PE_DEFAULTS`; None for no bias.
    """
    if decoder_pe is None:
        return None
    if isinstance(decoder_pe, str):
        decoder_pe = dict(type=decoder_pe)
    if not isinstance(decoder_pe, dict) or 'type' not in decoder_pe:
        raise ValueError(
            f'Unsupported `decoder_pe` {decoder_pe!r}, please give None, one '
            f'of {DECODER_PE_TYPES} or a dict with `type` from them')
    cfg = dict(decoder_pe)
    kind = cfg.pop('type')
    if kind not in DECODER_PE_TYPES:
        raise ValueError(f'Unsupported `decoder_pe.type` {kind!r}, please '
                         f'choose from {DECODER_PE_TYPES}')
    if kind not in allowed_types:
        raise ValueError(
            f'Unsupported `decoder_pe.type` {kind!r} for this detector (its '
            f'decoder has reference points, not boxes), please choose from '
            f'{allowed_types}')
    unknown = sorted(set(cfg) - set(DECODER_PE_DEFAULTS))
    if unknown:
        raise ValueError(f'Unknown `decoder_pe` keys {unknown}, please choose '
                         f'from {("type", *DECODER_PE_DEFAULTS)}')
    cfg = dict(DECODER_PE_DEFAULTS, **cfg)
    hidden = cfg['hidden']
    check_int('decoder_pe.hidden', hidden)
    if cfg['offsets'] not in RPB_OFFSETS:
        raise ValueError(f'Unsupported `decoder_pe.offsets` '
                         f'{cfg["offsets"]!r}, please choose from '
                         f'{RPB_OFFSETS}')
    stride = cfg['stride']
    if isinstance(stride, bool) or not isinstance(
            stride, (int, float)) or not stride > 0:
        raise ValueError(f'Unsupported `decoder_pe.stride` {stride!r}, please '
                         'choose a number > 0 (pixels per feature cell)')
    if not isinstance(cfg['shared'], bool):
        raise ValueError(f'Unsupported `decoder_pe.shared` '
                         f'{cfg["shared"]!r}, please choose True or False')
    if cfg['attn_impl'] not in CROSS_IMPL_CHOICES:
        raise ValueError(f'Unsupported `decoder_pe.attn_impl` '
                         f'{cfg["attn_impl"]!r}, please choose from '
                         f'{CROSS_IMPL_CHOICES}')
    check_int('decoder_pe.chunk_size', cfg['chunk_size'], hint='automatic',
              allow_none=True)
    return dict(cfg, type=kind, mode=kind.split('-')[0])
