"""DINOv3 weights (facebookresearch/dinov3, the hub's ``dinov3_vit{s,b,l}16``
distilled ViTs) onto :class:`~mmpe.models.backbones.CPVT` keys.

The authors' ``DinoVisionTransformer`` (``dinov3/models/
vision_transformer.py``; ``layers/attention.py``, ``layers/
rope_position_encoding.py``) is a pre-norm ViT with a class token, storage
(register) tokens, LayerScale, LayerNorm eps 1e-5, no absolute table, and
axial RoPE on patch centres normalised to ``[-1, 1]`` per axis, periods
``base ** (j / Q)`` (``Q = head_dim / 4``, base 100), rescaled by a
log-uniform factor up to 2 in training: CPVT with ``pos_encoding='rope2d'``
and ``rope_cfg=dict(theta=base, coords='normalized', rescale=2.)``
(:mod:`~mmpe.models.layers.encodings.rope_coords`)::

    patch_embed.proj.*         -> patch_embed.*
    cls_token                  -> cls_token
    storage_tokens             -> register_tokens
    rope_embed.periods         -> checked (base ** (j / Q)), gives theta and
                                  the head size
    blocks.N.attn.qkv.weight   -> same, q and k rows permuted per head
    blocks.N.attn.qkv.bias     -> times ``bias_mask`` (the k third 0, as
                                  ``LinearKMaskedBias`` computes), permuted
    blocks.N.attn.qkv.bias_mask -> folded into the bias
    blocks.N.{norm1,attn.proj,ls1.gamma,norm2,mlp.fc1,mlp.fc2,ls2.gamma}.*
                               -> same
    norm.*                     -> norm.*
    mask_token, local_cls_norm.* -> dropped (training only)

DINOv3 rotates channel ``i`` with ``i + D / 2`` of each head, the angles
laid out ``[y | x | y | x]`` (quarters); :func:`~mmpe.models.layers.
apply_rope2d` rotates ``(t, t + Q)`` at the x angles and ``(2Q + t, 3Q +
t)`` at the y angles. mmpe's channel ``m`` of q and k is DINOv3's
:func:`rope_channel_order` ``[m]``: the same rotations, and q . k unchanged
by a permutation common to q and k. The SwiGLU models (ViT-S+, H+, 7B) and
separate class-token norms (``cls_norm``) are not converted.
"""
from collections import OrderedDict
from typing import Dict, Tuple

import torch
from torch import Tensor

from .checkpoint_keys import CheckpointMismatch, check_keys, mlp_ratio_of

#: Per-block parameters of the authors' SelfAttentionBlock (MLP FFN,
#: LayerScale, ``mask_k_bias``)
BLOCK_KEYS = ('norm1.weight', 'norm1.bias', 'attn.qkv.weight',
              'attn.qkv.bias', 'attn.qkv.bias_mask', 'attn.proj.weight',
              'attn.proj.bias', 'ls1.gamma', 'norm2.weight', 'norm2.bias',
              'mlp.fc1.weight', 'mlp.fc1.bias', 'mlp.fc2.weight',
              'mlp.fc2.bias', 'ls2.gamma')
TOP_KEYS = ('cls_token', 'storage_tokens', 'rope_embed.periods',
            'patch_embed.proj.weight', 'patch_embed.proj.bias', 'norm.weight',
            'norm.bias')
OPTIONAL_KEYS = ('mask_token', 'local_cls_norm.weight', 'local_cls_norm.bias')
# the periods' check: float32 powers of the base
_PERIOD_RTOL = 1e-5


def rope_channel_order(head_dim: int) -> Tensor:
    """DINOv3's channel of each of mmpe's rotary channels of a head.

    mmpe's quarters (x first, x second, y first, y second member of the
    pairs at frequency ``t``) are DINOv3's ``Q + t``, ``3Q + t``, ``t``,
    ``2Q + t``.
    """
    q = head_dim // 4
    t = torch.arange(q)
    return torch.cat([q + t, 3 * q + t, t, 2 * q + t])


def _permute_qk(value: Tensor, num_heads: int, head_dim: int) -> Tensor:
    """Rows of the q and k thirds of a qkv weight / bias in mmpe's order."""
    order = rope_channel_order(head_dim)
    c = num_heads * head_dim
    q, k, v = value[:c], value[c:2 * c], value[2 * c:]
    rest = value.shape[1:]
    q, k = (t.reshape(num_heads, head_dim, *rest)[:, order].reshape(c, *rest)
            for t in (q, k))
    return torch.cat([q, k, v])


def infer_dinov3_config(state_dict: Dict[str, Tensor]) -> dict:
    """The CPVT config of a DINOv3 state dict (checks every key).

    Raises:
        CheckpointMismatch: keys of another model, missing keys, or RoPE
            periods that are not a base's powers.
    """
    keys = list(state_dict)
    depth = len({k.split('.')[1] for k in keys if k.startswith('blocks.')})
    want = list(TOP_KEYS) + [f'blocks.{i}.{k}' for i in range(max(depth, 1))
                             for k in BLOCK_KEYS]
    check_keys('DINOv3 (dinov3_vit{s,b,l}16)', keys, want, OPTIONAL_KEYS)
    dims = state_dict['cls_token'].shape[-1]
    periods = state_dict['rope_embed.periods'].double()
    quarter = periods.numel()
    head_dim = 4 * quarter
    if periods.is_meta:  # shapes only: the hub's base
        base = 100.
    else:
        base = float(periods[1] / periods[0])**quarter if quarter > 1 \
            else 100.
        # float32 periods: the base to a few digits, the hub's 100 exactly
        base = float(round(base)) if abs(base - round(base)) < 1e-3 * base \
            else base
        want_periods = base**(torch.arange(quarter).double() / quarter)
        if not torch.allclose(periods, want_periods, rtol=_PERIOD_RTOL):
            raise CheckpointMismatch(
                f'rope_embed.periods {periods.tolist()[:4]}... are not '
                'base ** (j / Q) from 1 (min_period / max_period RoPE): '
                'not a DINOv3 ViT-S/B/L')
    patch = state_dict['patch_embed.proj.weight'].shape[-1]
    return dict(
        type='CPVT',
        arch=dict(embed_dims=dims, depth=depth, num_heads=dims // head_dim,
                  mlp_ratio=mlp_ratio_of(
                      state_dict['blocks.0.mlp.fc1.weight'].shape[0], dims)),
        img_size=224,
        patch_size=patch,
        pos_encoding='rope2d',
        rope_cfg=dict(theta=base, coords='normalized',
                      normalize='separate', rescale=2.),
        use_cls_token=True,
        num_register_tokens=state_dict['storage_tokens'].shape[1],
        block_cfg=dict(layer_scale_init=1e-5),
        qkv_bias=True,
        norm_cfg=dict(type='LN', eps=1e-5),
        final_norm=True)


def dinov3_to_mmpe(state_dict: Dict[str, Tensor],
                   drop_prefix_tokens: bool = False
                   ) -> Tuple['OrderedDict[str, Tensor]', dict]:
    """Map a DINOv3 state dict to CPVT keys and its CPVT config.

    Args:
        state_dict (dict[str, Tensor]): The authors' weights (the hub's
            ``dinov3_vit*16_pretrain_lvd1689m-*.pth``).
        drop_prefix_tokens (bool): Drop the class and storage tokens
            (``use_cls_token=False``, ``num_register_tokens=0``) for window
            blocks. Defaults to False.

    Returns:
        tuple: The converted weights and the backbone config.

    Raises:
        CheckpointMismatch: keys of another model, or missing keys.
    """
    config = infer_dinov3_config(state_dict)
    heads = config['arch']['num_heads']
    head_dim = config['arch']['embed_dims'] // heads
    out = OrderedDict()
    for key, value in state_dict.items():
        if key in OPTIONAL_KEYS or key == 'rope_embed.periods' or \
                key.endswith('.bias_mask'):
            continue
        if key.startswith('patch_embed.proj.'):
            key = 'patch_embed.' + key[len('patch_embed.proj.'):]
        elif key == 'storage_tokens':
            key = 'register_tokens'
        elif key.endswith('attn.qkv.bias'):
            value = value * state_dict[key + '_mask'].to(value.dtype)
            if not value.is_meta and not torch.isfinite(value).all():
                raise CheckpointMismatch(
                    f'{key}_mask is not finite (a model saved before its '
                    'init_weights): not a released DINOv3 state dict')
        if key.endswith(('attn.qkv.weight', 'attn.qkv.bias')):
            value = _permute_qk(value, heads, head_dim)
        if drop_prefix_tokens and key in ('cls_token', 'register_tokens'):
            continue
        out[key] = value
    if drop_prefix_tokens:
        config.update(use_cls_token=False, num_register_tokens=0)
    return out, config
