"""The released RT-DETRv2 decoder's state-dict keys in mmpe's.

The released model (``rtdetrv2_pytorch/src/zoo/rtdetr/rtdetr.py``) holds
its ``RTDETRTransformerv2`` as ``decoder``; mmpe's
:class:`~mmpe.models.RTDETRHead` keeps that module's parameter names, so a
key maps by its prefix, ``decoder.`` -> ``bbox_head.``. Buffers that
mmpe derives from the settings or the input are dropped: every deformable
attention's ``num_points_scale`` (``1 / P_l`` per point) and, in models
built with ``eval_spatial_size``, the precomputed ``anchors`` and
``valid_mask`` (mmpe builds them for each input's grid and padding). The
backbone's and the encoder's keys are
:mod:`mmpe.models.utils.rtdetr_backbone_keys`'s business; this module
refuses them.
"""
from typing import Dict, Optional

from torch import Tensor

#: the released decoder's prefix in its model, and the head's in mmpe's
AUTHORS_PREFIX = 'decoder.'
MMPE_PREFIX = 'bbox_head.'
#: buffers of the released decoder that mmpe derives instead of loading
DERIVED = ('anchors', 'valid_mask')
DERIVED_SUFFIXES = ('.num_points_scale', )


def rtdetr_decoder_key(key: str) -> Optional[str]:
    """mmpe's name for one released decoder key, or None for a buffer that
    mmpe derives.

    Args:
        key (str): a key of the released model, starting with
            ``decoder.`` (e.g. ``decoder.decoder.layers.0.cross_attn.
            sampling_offsets.weight``).

    Returns:
        str | None: e.g. ``bbox_head.decoder.layers.0.cross_attn.
        sampling_offsets.weight``.
    """
    if not key.startswith(AUTHORS_PREFIX):
        raise ValueError(f'{key!r} is not a key of the released RT-DETR '
                         f'decoder (they start with {AUTHORS_PREFIX!r})')
    name = key[len(AUTHORS_PREFIX):]
    if name in DERIVED or name.endswith(DERIVED_SUFFIXES):
        return None
    return MMPE_PREFIX + name


def convert_rtdetr_decoder(state_dict: Dict[str, Tensor]
                           ) -> Dict[str, Tensor]:
    """The ``decoder.*`` entries of a released state dict under mmpe's
    names (derived buffers dropped; other keys ignored).

    Args:
        state_dict (dict[str, Tensor]): a released model's state dict (the
            ``model`` or ``ema.module`` entry of its checkpoint).

    Returns:
        dict[str, Tensor]: ``bbox_head.*`` entries.
    """
    out = {}
    for key, value in state_dict.items():
        if not key.startswith(AUTHORS_PREFIX):
            continue
        new = rtdetr_decoder_key(key)
        if new is not None:
            out[new] = value
    return out
