"""DINOv2 weights (facebookresearch/dinov2, the hub's ``dinov2_vit{s,b,l}14``
and ``*_reg`` state dicts) onto :class:`~mmpe.models.backbones.CPVT` keys.

The authors' ``DinoVisionTransformer`` (``dinov2/models/
vision_transformer.py``, blocks of ``dinov2/layers/block.py``) is a
pre-norm ViT with a class token, an absolute table for the pretraining
grid (518 px / 14 = 37 x 37, a class row first), optional register tokens
after the class token (no table row), LayerScale on both residual branches
and LayerNorm eps 1e-6: CPVT with ``pos_encoding='learnable'``,
``use_cls_token=True``, ``num_register_tokens``, LayerScale
(``block_cfg``) and the table resampled per image as
``interpolate_pos_encoding`` does (``pos_embed_interp='dinov2'`` for the
original models: plain bicubic with the 0.1 offset; ``'dinov2-reg'`` for
the models with registers: antialiased, no offset; the hub's settings)::

    patch_embed.proj.*        -> patch_embed.*
    cls_token, pos_embed      -> same (the class row dropped with the token)
    register_tokens           -> same
    blocks.N.{norm1,attn.qkv,attn.proj,ls1.gamma,norm2,mlp.fc1,mlp.fc2,
              ls2.gamma}.*    -> same (``blocks.C.N.*`` of chunked blocks too)
    norm.*                    -> norm.*
    mask_token                -> dropped (masked-image training only)

ViT-g's SwiGLU MLP (``mlp.w12`` / ``mlp.w3``) is not converted.
"""
import math
import re
from collections import OrderedDict
from typing import Dict, Optional, Tuple

from torch import Tensor

from .checkpoint_keys import CheckpointMismatch, check_keys, mlp_ratio_of

#: The hub's backbones by width: (depth, heads); ViT-g (1536) has SwiGLU
DINOV2_ARCHS = {384: (12, 6), 768: (12, 12), 1024: (24, 16)}
#: Per-block parameters of the authors' Block (MLP FFN, LayerScale)
BLOCK_KEYS = ('norm1.weight', 'norm1.bias', 'attn.qkv.weight',
              'attn.qkv.bias', 'attn.proj.weight', 'attn.proj.bias',
              'ls1.gamma', 'norm2.weight', 'norm2.bias', 'mlp.fc1.weight',
              'mlp.fc1.bias', 'mlp.fc2.weight', 'mlp.fc2.bias', 'ls2.gamma')
#: Keys outside the blocks
TOP_KEYS = ('cls_token', 'pos_embed', 'patch_embed.proj.weight',
            'patch_embed.proj.bias', 'norm.weight', 'norm.bias')
OPTIONAL_KEYS = ('register_tokens', 'mask_token')


def _unchunk(key: str) -> str:
    """``blocks.C.N.rest`` (the authors' FSDP chunks) -> ``blocks.N.rest``."""
    return re.sub(r'^blocks\.\d+\.(\d+)\.', r'blocks.\1.', key)


def infer_dinov2_config(state_dict: Dict[str, Tensor],
                        num_heads: Optional[int] = None) -> dict:
    """The CPVT config of a DINOv2 state dict (checks every key).

    Args:
        state_dict (dict[str, Tensor]): The authors' weights.
        num_heads (int, optional): Attention heads (the weights do not tell
            them). None: the hub model's of that width (:data:`DINOV2_ARCHS`).

    Raises:
        CheckpointMismatch: keys of another model, or missing keys.
    """
    keys = [_unchunk(k) for k in state_dict]
    blocks = sorted({int(k.split('.')[1]) for k in keys
                     if k.startswith('blocks.')})
    depth = len(blocks)
    want = list(TOP_KEYS) + [f'blocks.{i}.{k}' for i in range(max(depth, 1))
                             for k in BLOCK_KEYS]
    check_keys('DINOv2 (dinov2_vit{s,b,l}14[_reg])', keys, want,
               OPTIONAL_KEYS)
    sd = {_unchunk(k): v for k, v in state_dict.items()}
    dims = sd['cls_token'].shape[-1]
    if num_heads is None:
        if dims not in DINOV2_ARCHS:
            raise CheckpointMismatch(
                f'width {dims} (depth {depth}) is not a DINOv2 hub backbone '
                f'({DINOV2_ARCHS} as width: (depth, heads)); give num_heads')
        num_heads = DINOV2_ARCHS[dims][1]
    patch = sd['patch_embed.proj.weight'].shape[-1]
    side = math.isqrt(sd['pos_embed'].shape[1] - 1)
    registers = sd['register_tokens'].shape[1] \
        if 'register_tokens' in sd else 0
    return dict(
        type='CPVT',
        arch=dict(embed_dims=dims, depth=depth,
                  num_heads=num_heads, mlp_ratio=mlp_ratio_of(
                      sd['blocks.0.mlp.fc1.weight'].shape[0], dims)),
        img_size=side * patch,
        patch_size=patch,
        pos_encoding='learnable',
        use_cls_token=True,
        num_register_tokens=registers,
        block_cfg=dict(layer_scale_init=1.0),
        qkv_bias=True,
        norm_cfg=dict(type='LN', eps=1e-6),
        final_norm=True,
        pos_embed_interp='dinov2-reg' if registers else 'dinov2')


def dinov2_to_mmpe(state_dict: Dict[str, Tensor],
                   drop_prefix_tokens: bool = False,
                   num_heads: Optional[int] = None
                   ) -> Tuple['OrderedDict[str, Tensor]', dict]:
    """Map a DINOv2 state dict to CPVT keys and its CPVT config.

    Args:
        state_dict (dict[str, Tensor]): The authors' ``DinoVisionTransformer``
            weights (the hub's ``*_pretrain.pth``).
        drop_prefix_tokens (bool): Drop the class token, the registers and
            the class row of the table (``use_cls_token=False``,
            ``num_register_tokens=0``): for ViTDet's window blocks, which
            have no place for them (as ViTDet drops MAE's class token).
            Defaults to False.
        num_heads (int, optional): Attention heads; None: the hub model's
            of that width.

    Returns:
        tuple: The converted weights and the backbone config.

    Raises:
        CheckpointMismatch: keys of another model, or missing keys.
    """
    config = infer_dinov2_config(state_dict, num_heads)
    out = OrderedDict()
    for key, value in state_dict.items():
        key = _unchunk(key)
        if key == 'mask_token':
            continue
        if key.startswith('patch_embed.proj.'):
            key = 'patch_embed.' + key[len('patch_embed.proj.'):]
        if drop_prefix_tokens:
            if key in ('cls_token', 'register_tokens'):
                continue
            if key == 'pos_embed':
                value = value[:, 1:]
        out[key] = value
    if drop_prefix_tokens:
        config.update(use_cls_token=False, num_register_tokens=0)
    return out, config
