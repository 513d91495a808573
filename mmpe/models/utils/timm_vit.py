"""timm DeiT / ViT (and RoPE-Mixed ViT) weights onto
:class:`~mmpe.models.backbones.CPVT` keys.

Used by ``tools/model_converters/timm_vit_to_cpvt.py`` and the tests that
compare CPVT with real timm models.
"""
import math
import re
from collections import OrderedDict
from typing import Dict, Sequence, Union

import torch
from torch import Tensor

from .vit_pos_encodings import parse_pos_encoding


def timm_vit_to_cpvt(
        state_dict: Dict[str, Tensor],
        pos_encoding: Union[str, Sequence[str]] = 'peg',
        use_cls_token: bool = False) -> 'OrderedDict[str, Tensor]':
    """Map a timm DeiT/ViT state dict to :class:`CPVT` keys.

    Handles timm's ``VisionTransformer`` layout (e.g.
    ``deit_tiny_patch16_224``, ``vit_small_patch16_224``) and its
    RoPE-Mixed ViTs (``vit_*_patch16_rope_mixed_*``, Eva blocks)::

        patch_embed.proj.*               -> patch_embed.*
        cls_token                        -> cls_token (kept iff use_cls_token)
        pos_embed                        -> pos_embed (kept iff 'learnable';
                                            class row kept iff use_cls_token)
        blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}.*
                                         -> same
        norm.* (or fc_norm.* when norm is absent) -> norm.*
        head*, dist_token                -> dropped
        rope.freqs (2, depth, H, D / 2)  -> ropes.N.freqs (2, H, D / 2)
                                            (kept iff 'rope-mixed'; then the
                                            q, k rows of every qkv are
                                            permuted, see below)
        blocks.N.gamma_1 / gamma_2       -> folded into attn.proj / mlp.fc2

    timm rotates interleaved channel pairs ``(2t, 2t + 1)`` of each head;
    :func:`~mmpe.models.layers.apply_rope2d` rotates ``(t, t + D / 4)``
    and ``(D / 2 + t, 3 D / 4 + t)``. Reordering the q and k output
    channels of each head (each half de-interleaved: ``[even | odd]``)
    moves timm's pair t onto mmpe's pair t; q . k is unchanged by a common
    permutation, so the attention is the same function. Eva's LayerScale
    ``x + gamma * f(x)`` is exact as ``f``'s last linear scaled row-wise by
    ``gamma`` (drop path is the identity at inference).

    Any other key (LayerScale, q/k norms, ...) is a layout CPVT does not
    have and raises ``ValueError``.

    Args:
        state_dict (dict[str, Tensor]): timm model weights (a ``module.``
            prefix is stripped).
        pos_encoding (str | Sequence[str]): Target ``CPVT.pos_encoding``.
            Defaults to 'peg'.
        use_cls_token (bool): Target ``CPVT.use_cls_token``.
            Defaults to False.

    Returns:
        OrderedDict[str, Tensor]: CPVT weights; PEG / iRPE parameters (and
        RoPE-Mixed ones the checkpoint lacks) are absent (newly initialised
        when loading).
    """
    encodings = parse_pos_encoding(pos_encoding)
    state_dict = {
        (k[len('module.'):] if k.startswith('module.') else k): v
        for k, v in state_dict.items()
    }
    state_dict = _from_eva_layout(state_dict, 'rope-mixed' in encodings)
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
        elif (block_key.match(key) or key.startswith('norm.')
              or _ROPE_KEY.match(key)):
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


_ROPE_KEY = re.compile(r'^ropes\.\d+\.freqs$')


def _from_eva_layout(state_dict: Dict[str, Tensor],
                     rope_mixed: bool) -> Dict[str, Tensor]:
    """Fold Eva's LayerScale; split ``rope.freqs`` per block and reorder
    the q, k channels (kept iff ``rope_mixed``; else both dropped)."""
    gamma_key = re.compile(r'^blocks\.(\d+)\.gamma_([12])$')
    out = {
        k: v
        for k, v in state_dict.items()
        if k != 'rope.freqs' and not gamma_key.match(k)
    }
    for key, gamma in state_dict.items():
        match = gamma_key.match(key)
        if match is None:
            continue
        branch = 'attn.proj' if match[2] == '1' else 'mlp.fc2'
        layer = f'blocks.{match[1]}.{branch}'
        if layer + '.weight' not in state_dict:
            raise ValueError(f'timm_vit_to_cpvt: {key} has no {layer}.weight '
                             'to fold into')
        out[layer + '.weight'] = state_dict[layer + '.weight'] * gamma[:, None]
        if layer + '.bias' in state_dict:
            out[layer + '.bias'] = state_dict[layer + '.bias'] * gamma
    freqs = state_dict.get('rope.freqs')
    if freqs is None or not rope_mixed:
        return out
    if freqs.dim() != 4 or freqs.shape[0] != 2:
        raise ValueError(f'timm_vit_to_cpvt: rope.freqs of shape '
                         f'{tuple(freqs.shape)} is not RoPE-Mixed\'s '
                         '(2, depth, num_heads, head_dim / 2)')
    _, depth, heads, half = freqs.shape
    for i in range(depth):
        out[f'ropes.{i}.freqs'] = freqs[:, i].clone()
    # timm channel of each of mmpe's head channels: [even | odd] per half
    perm = torch.cat([torch.arange(0, half, 2), torch.arange(1, half, 2),
                      torch.arange(half, 2 * half, 2),
                      torch.arange(half + 1, 2 * half, 2)])
    # rows of qkv: [q heads | k heads | v heads], head_dim rows per head
    rows = torch.arange(3 * heads * 2 * half).view(3, heads, 2 * half)
    rows[:2] = rows[:2, :, perm]
    for key in list(out):
        if re.match(r'^blocks\.\d+\.attn\.qkv\.(weight|bias)$', key):
            if out[key].shape[0] != rows.numel():
                raise ValueError(
                    f'timm_vit_to_cpvt: {key} has {out[key].shape[0]} rows, '
                    f'rope.freqs implies 3 * {heads} heads * {2 * half}')
            out[key] = out[key][rows.flatten()]
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
