"""timm DeiT / ViT weights onto :class:`~mmpe.models.backbones.CPVT` keys.

Used by ``tools/model_converters/timm_vit_to_cpvt.py`` and the tests that
compare CPVT with real timm models.
"""
import math
import re
from collections import OrderedDict
from typing import Dict, Sequence, Union

import torch
from torch import Tensor

from ..backbones.vit_args import parse_pos_encoding


def timm_vit_to_cpvt(
        state_dict: Dict[str, Tensor],
        pos_encoding: Union[str, Sequence[str]] = 'peg',
        use_cls_token: bool = False) -> 'OrderedDict[str, Tensor]':
    """Map a timm DeiT/ViT state dict to :class:`CPVT` keys.

    Handles timm's ``VisionTransformer`` layout (e.g.
    ``deit_tiny_patch16_224``, ``vit_small_patch16_224``)::

        patch_embed.proj.*               -> patch_embed.*
        cls_token                        -> cls_token (kept iff use_cls_token)
        pos_embed                        -> pos_embed (kept iff 'learnable';
                                            class row kept iff use_cls_token)
        blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}.*
                                         -> same
        norm.* (or fc_norm.* when norm is absent) -> norm.*
        head*, dist_token                -> dropped

    Any other key (LayerScale, q/k norms, ...) is a layout CPVT does not
    have and raises ``ValueError``.

    Args:
        state_dict (dict[str, Tensor]): timm model weights (a ``module.``
            prefix is stripped).
        pos_encoding (str | Sequence[str]): Target ``CPVT.pos_encoding``. Defaults to 'peg'.
        use_cls_token (bool): Target ``CPVT.use_cls_token``.
            Defaults to False.

    Returns:
        OrderedDict[str, Tensor]: CPVT weights; PEG / RoPE / iRPE parameters
        are absent (newly initialised when loading).
    """
    encodings = parse_pos_encoding(pos_encoding)
    state_dict = {
        (k[len('module.'):] if k.startswith('module.') else k): v
        for k, v in state_dict.items()
    }
    block_key = re.compile(
        r'^blocks\.(\d+)\.(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|'
        r'mlp\.fc2)\.(weight|bias)$')
    out: 'OrderedDict[str, Tensor]' = OrderedDict()
    unknown = []
    for key, value in state_dict.items():
        if key.startswith('patch_embed.proj.'):
            out['patch_embed.' + key[len('patch_embed.proj.'):]] = value
        elif key == 'cls_token':
            if use_cls_token:
                out[key] = value
        elif key == 'pos_embed':
            if 'learnable' in encodings:
                out[key] = _convert_pos_embed(value, state_dict,
                                              use_cls_token)
        elif block_key.match(key) or key.startswith('norm.'):
            out[key] = value
        elif key.startswith('fc_norm.'):
            if 'norm.weight' not in state_dict:
                out['norm.' + key[len('fc_norm.'):]] = value
        elif key.startswith('head') or key == 'dist_token':
            continue
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f'timm_vit_to_cpvt: keys with no CPVT counterpart '
                         f'(unsupported timm layout): {unknown[:10]}')
    return out


def _convert_pos_embed(table: Tensor, state_dict: Dict[str, Tensor],
                       use_cls_token: bool) -> Tensor:
    """timm ``pos_embed`` ``(1, prefix + h0*w0, C)`` -> CPVT's table."""
    n = table.shape[1]
    if math.isqrt(n)**2 == n:  # timm's no_embed_class: no prefix rows
        prefix, grid = table[:, :0], table
    else:
        num_prefix = int('cls_token' in state_dict) + int(
            'dist_token' in state_dict)
        prefix, grid = table[:, :num_prefix], table[:, num_prefix:]
        if math.isqrt(grid.shape[1])**2 != grid.shape[1]:
            raise ValueError(f'timm_vit_to_cpvt: cannot split pos_embed of '
                             f'length {n} into prefix rows and a square grid')
    if not use_cls_token:
        return grid
    cls_row = prefix[:, :1] if prefix.shape[1] else table.new_zeros(
        1, 1, table.shape[-1])
    return torch.cat([cls_row, grid], dim=1)
