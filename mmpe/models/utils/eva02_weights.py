"""EVA-02 weights (the MIM-pretrained ``eva02_{base,large}_patch14_224`` that
the authors publish through timm, ``timm.models.eva.Eva``) onto
:class:`~mmpe.models.backbones.CPVT` keys.

timm's ``Eva`` with EVA-02's settings (Fang et al., "EVA-02", 2024;
``eva02_*_patch14_224``: unfused q / k / v with q and v biases, SwiGLU
with a sub-LN of its hidden channels, an absolute table for the 16 x 16
pretraining grid with a class row, 2D RoPE with base 10000 on every block)
is CPVT with ``pos_encoding=('learnable', 'rope2d')``,
``block_cfg=dict(mlp_type='swiglu-subln')`` and the RoPE positions
"interpolated" from the pretraining grid ``pt`` to the grid ``ft`` the
model is set up for (``rope_cfg.scale = pt / ft`` per axis: timm's
``ref_feat_shape / feat_shape``, EVA-02 detection's ``pt_seq_len /
ft_seq_len``; window blocks ``pt / S``, ``rope_cfg.window_scale``, as its
window RoPE)::

    patch_embed.proj.*            -> patch_embed.*
    cls_token, pos_embed          -> same (the class row dropped with the
                                     token)
    blocks.N.attn.{q,k,v}_proj.*  -> blocks.N.attn.qkv.* (k bias 0), the q
                                     and k rows permuted per head
    blocks.N.mlp.{fc1_g,fc1_x,norm,fc2}.*, norm1, norm2, attn.proj
                                  -> same
    norm.* (when present)         -> norm.* (EVA-02's MIM models have none)
    fc_norm.*, head.*             -> dropped (the pooled classifier)

timm rotates interleaved channel pairs ``(2t, 2t + 1)`` of each head, the
rows' (y) bands in the first half and the columns' (x) in the second;
:func:`~mmpe.models.layers.apply_rope2d` rotates ``(t, t + Q)`` at x and
``(2Q + t, 3Q + t)`` at y: mmpe's channel ``m`` of q and k is timm's
:func:`rope_channel_order` ``[m]``.
"""
from collections import OrderedDict
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .checkpoint_keys import CheckpointMismatch, check_keys, mlp_ratio_of

#: timm's ``eva02_*_patch14_224`` by width: (depth, heads)
EVA02_ARCHS = {768: (12, 12), 1024: (24, 16)}
BLOCK_KEYS = ('norm1.weight', 'norm1.bias', 'attn.q_proj.weight',
              'attn.q_proj.bias', 'attn.k_proj.weight', 'attn.v_proj.weight',
              'attn.v_proj.bias', 'attn.proj.weight', 'attn.proj.bias',
              'norm2.weight', 'norm2.bias', 'mlp.fc1_g.weight',
              'mlp.fc1_g.bias', 'mlp.fc1_x.weight', 'mlp.fc1_x.bias',
              'mlp.norm.weight', 'mlp.norm.bias', 'mlp.fc2.weight',
              'mlp.fc2.bias')
TOP_KEYS = ('cls_token', 'pos_embed', 'patch_embed.proj.weight',
            'patch_embed.proj.bias')
OPTIONAL_KEYS = ('norm.weight', 'norm.bias', 'fc_norm.weight', 'fc_norm.bias',
                 'head.weight', 'head.bias')


def rope_channel_order(head_dim: int) -> Tensor:
    """timm's channel of each of mmpe's rotary channels of a head: mmpe's
    quarters (x first, x second, y first, y second member at band ``t``)
    are timm's ``2Q + 2t``, ``2Q + 2t + 1``, ``2t``, ``2t + 1``."""
    t = torch.arange(head_dim // 4)
    q = head_dim // 4
    return torch.cat([2 * q + 2 * t, 2 * q + 2 * t + 1, 2 * t, 2 * t + 1])


def infer_eva02_config(state_dict: Dict[str, Tensor],
                       num_heads: Optional[int] = None) -> dict:
    """The CPVT config of an EVA-02 state dict at its pretraining grid
    (checks every key; heads from :data:`EVA02_ARCHS` unless given)."""
    keys = list(state_dict)
    depth = len({k.split('.')[1] for k in keys if k.startswith('blocks.')})
    want = list(TOP_KEYS) + [f'blocks.{i}.{k}' for i in range(max(depth, 1))
                             for k in BLOCK_KEYS]
    check_keys('EVA-02 (timm eva02_{base,large}_patch14_224)', keys, want,
               OPTIONAL_KEYS)
    dims = state_dict['cls_token'].shape[-1]
    if num_heads is None:
        if dims not in EVA02_ARCHS:
            raise CheckpointMismatch(
                f'width {dims} (depth {depth}) is not an EVA-02 B / L '
                f'({EVA02_ARCHS} as width: (depth, heads)); give num_heads')
        num_heads = EVA02_ARCHS[dims][1]
    side = int(round((state_dict['pos_embed'].shape[1] - 1)**0.5))
    patch = state_dict['patch_embed.proj.weight'].shape[-1]
    return dict(
        type='CPVT',
        arch=dict(embed_dims=dims, depth=depth, num_heads=num_heads,
                  mlp_ratio=mlp_ratio_of(
                      state_dict['blocks.0.mlp.fc1_g.weight'].shape[0],
                      dims)),
        img_size=side * patch,
        patch_size=patch,
        pos_encoding=('learnable', 'rope2d'),
        rope_cfg=dict(theta=10000.),
        use_cls_token=True,
        block_cfg=dict(mlp_type='swiglu-subln'),
        qkv_bias=True,
        norm_cfg=dict(type='LN', eps=1e-6),
        final_norm='norm.weight' in state_dict,
        pos_embed_interp='timm')


def eva02_to_mmpe(state_dict: Dict[str, Tensor],
                  ft_grid: Optional[Sequence[int]] = None,
                  window_size: int = 0,
                  drop_prefix_tokens: bool = False,
                  num_heads: Optional[int] = None
                  ) -> Tuple['OrderedDict[str, Tensor]', dict]:
    """Map an EVA-02 state dict to CPVT keys and its CPVT config.

    Args:
        state_dict (dict[str, Tensor]): timm's ``Eva`` weights.
        ft_grid (Sequence[int], optional): The token grid ``(h, w)`` the
            RoPE positions are interpolated to (``rope_cfg.scale = pt /
            ft``); None: the pretraining grid (scale 1).
        window_size (int): With a window side S > 0, the window blocks'
            positions are interpolated to ``(S, S)``
            (``rope_cfg.window_scale = pt / S``). Defaults to 0.
        drop_prefix_tokens (bool): Drop the class token and the table's
            class row (for window blocks). Defaults to False.
        num_heads (int, optional): Heads; None: EVA-02 B / L's of that
            width.

    Returns:
        tuple: The converted weights and the backbone config.

    Raises:
        CheckpointMismatch: keys of another model, or missing keys.
    """
    config = infer_eva02_config(state_dict, num_heads)
    heads = config['arch']['num_heads']
    dims = config['arch']['embed_dims']
    order = rope_channel_order(dims // heads)
    pt = config['img_size'] // config['patch_size']
    ft = (pt, pt) if ft_grid is None else tuple(ft_grid)
    if ft != (pt, pt):
        config['rope_cfg']['scale'] = (pt / ft[0], pt / ft[1])
    if window_size:
        config['rope_cfg']['window_scale'] = pt / window_size

    def permute(value: Tensor) -> Tensor:
        rest = value.shape[1:]
        return value.reshape(heads, -1, *rest)[:, order].reshape(dims, *rest)

    out = OrderedDict()
    for key, value in state_dict.items():
        if key.startswith(('fc_norm.', 'head.')) or '.attn.k_proj.' in key \
                or '.attn.v_proj.' in key:
            continue
        if key.startswith('patch_embed.proj.'):
            key = 'patch_embed.' + key[len('patch_embed.proj.'):]
        elif '.attn.q_proj.' in key:
            block = key[:key.index('.attn.q_proj.')]
            leaf = key.rsplit('.', 1)[-1]
            q = state_dict[f'{block}.attn.q_proj.{leaf}']
            k = state_dict[f'{block}.attn.k_proj.weight'] \
                if leaf == 'weight' else torch.zeros_like(q)
            v = state_dict[f'{block}.attn.v_proj.{leaf}']
            key, value = f'{block}.attn.qkv.{leaf}', torch.cat(
                [permute(q), permute(k), v])
        if drop_prefix_tokens:
            if key == 'cls_token':
                continue
            if key == 'pos_embed':
                value = value[:, 1:]
        out[key] = value
    if drop_prefix_tokens:
        config['use_cls_token'] = False
    return out, config
