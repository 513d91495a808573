"""detectron2's ViTDet (``ViT`` + ``SimpleFeaturePyramid``) written out from
its equations, on weights in detectron2's key layout: the reference that
tests compare mmpe's CPVT and ViTSimpleFPN with. Nothing of mmpe is used.

From Li et al., "Exploring Plain Vision Transformer Backbones for Object
Detection" (ECCV 2022, Sec. 3) and MViTv2 (CVPR 2022, Eq. 4-5), with the
conventions of detectron2's ``modeling/backbone/vit.py`` / ``utils.py``:

- patch embedding: a ``p x p`` conv of stride p;
- absolute table (``get_abs_pos``): the class row dropped, the ``g x g``
  grid resized to the input's by bicubic interpolation
  (``align_corners=False``, no antialias), only when the grids differ;
- block: ``x + attn(LN1(x))``, ``x + mlp(LN2(x))`` (LayerNorm eps 1e-6,
  exact GELU); a window block cuts the *normed* tokens into ``S x S``
  windows, the grid zero-padded bottom/right to whole windows, and every
  query attends to all ``S * S`` tokens of its window, the zero ones
  included; the window's outputs inside the grid are kept;
- attention logits ``(q / sqrt(d)) . k + q . R_h[iy - jy] + q . R_w[ix -
  jx]`` (q unscaled, per head; one table pair per block), each table
  resized linearly (``F.interpolate(mode='linear', align_corners=False)``
  along its rows) to ``2 n - 1`` rows when its length differs;
- pyramid level of scale f from the last map: f = 4: deconv 2x2/2,
  channel LayerNorm, GELU, deconv 2x2/2; f = 2: deconv; f = 1: nothing;
  f = 0.5: max-pool 2x2/2; then a 1x1 conv and a 3x3 conv (no bias, each
  followed by a channel LayerNorm, eps 1e-6); the top level: max-pool of
  kernel 1, stride 2 of the last level.

``key_mask`` extends detectron2 by the batch padding of a padding-aware
detector: masked tokens are zeroed after the absolute table and are masked
keys in every block (a window whose keys are all masked is left unmasked);
the window padding stays zero tokens that are attended to.
"""
import math
from collections import OrderedDict
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

NET = 'backbone.net.'
_LN_EPS = 1e-6  # ViTDet: partial(nn.LayerNorm, eps=1e-6), LayerNorm 2d


def vitdet_d2_shapes(dims: int,
                     depth: int,
                     num_heads: int,
                     window_blocks: Sequence[int],
                     window_size: int = 14,
                     img_grid: int = 64,
                     pretrain_grid: int = 14,
                     patch: int = 16,
                     mlp_ratio: float = 4.,
                     out_channels: int = 256,
                     scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5),
                     heads: bool = True) -> 'OrderedDict[str, tuple]':
    """``name -> shape`` of a detectron2 ViTDet Mask R-CNN state dict,
    written from ``ViT`` (``use_abs_pos``, ``use_rel_pos``, class row in
    the table, ``input_size = (img_grid, img_grid)``),
    ``SimpleFeaturePyramid`` (norm ``'LN'``, so no conv biases) and, with
    ``heads``, a few keys of its RPN / ROI heads."""
    d = dims // num_heads
    hidden = int(dims * mlp_ratio)
    shapes = OrderedDict()
    shapes[NET + 'pos_embed'] = (1, 1 + pretrain_grid**2, dims)
    shapes[NET + 'patch_embed.proj.weight'] = (dims, 3, patch, patch)
    shapes[NET + 'patch_embed.proj.bias'] = (dims, )
    for i in range(depth):
        b = f'{NET}blocks.{i}.'
        n = window_size if i in window_blocks else img_grid
        for name, shape in (('norm1', (dims, )), ('attn.qkv', (3 * dims,
                                                                dims)),
                            ('attn.proj', (dims, dims)), ('norm2', (dims, )),
                            ('mlp.fc1', (hidden, dims)),
                            ('mlp.fc2', (dims, hidden))):
            shapes[f'{b}{name}.weight'] = shape
            shapes[f'{b}{name}.bias'] = shape[:1]
        shapes[b + 'attn.rel_pos_h'] = (2 * n - 1, d)
        shapes[b + 'attn.rel_pos_w'] = (2 * n - 1, d)
    for scale in scale_factors:
        p = f'backbone.simfp_{int(math.log2(patch / scale))}.'
        c, first = dims, 0
        if scale == 4.0:
            shapes[p + '0.weight'] = (dims, dims // 2, 2, 2)
            shapes[p + '0.bias'] = (dims // 2, )
            shapes[p + '1.weight'] = (dims // 2, )
            shapes[p + '1.bias'] = (dims // 2, )
            shapes[p + '3.weight'] = (dims // 2, dims // 4, 2, 2)
            shapes[p + '3.bias'] = (dims // 4, )
            c, first = dims // 4, 4
        elif scale == 2.0:
            shapes[p + '0.weight'] = (dims, dims // 2, 2, 2)
            shapes[p + '0.bias'] = (dims // 2, )
            c, first = dims // 2, 1
        elif scale == 0.5:
            first = 1
        for j, (cin, k) in enumerate(((c, 1), (out_channels, 3))):
            shapes[f'{p}{first + j}.weight'] = (out_channels, cin, k, k)
            shapes[f'{p}{first + j}.norm.weight'] = (out_channels, )
            shapes[f'{p}{first + j}.norm.bias'] = (out_channels, )
    if heads:
        shapes['proposal_generator.rpn_head.conv.conv0.weight'] = (256, 256,
                                                                   3, 3)
        shapes['proposal_generator.rpn_head.objectness_logits.weight'] = (
            3, 256, 1, 1)
        shapes['roi_heads.box_head.conv1.weight'] = (256, 256, 3, 3)
        shapes['roi_heads.box_head.conv1.norm.weight'] = (256, )
        shapes['roi_heads.box_predictor.cls_score.weight'] = (81, 1024)
        shapes['roi_heads.mask_head.predictor.weight'] = (80, 256, 1, 1)
    return shapes


def random_weights(shapes: Dict[str, tuple], seed: int = 0,
                   dtype: torch.dtype = torch.float64) -> Dict[str, Tensor]:
    """Random values of ``shapes`` (norm weights around 1, the rest around
    0, relative tables non-zero as after training)."""
    g = torch.Generator().manual_seed(seed)
    out = OrderedDict()
    for name, shape in shapes.items():
        value = torch.randn(shape, generator=g, dtype=dtype)
        if 'norm' in name and name.endswith('weight') and len(shape) == 1:
            value = 1 + 0.1 * value
        elif '.1.weight' in name and len(shape) == 1:  # simfp LayerNorm
            value = 1 + 0.1 * value
        elif 'rel_pos' in name or 'pos_embed' in name:
            value = 0.5 * value
        else:
            fan_in = math.prod(shape[1:]) if len(shape) > 1 else 1
            value = value / math.sqrt(max(fan_in, 1))
        out[name] = value
    return out


def get_abs_pos(table: Tensor, grid: Tuple[int, int]) -> Tensor:
    """(1, 1 + g * g, C) -> (1, h, w, C): the class row dropped, bicubic."""
    table = table[:, 1:]
    g = math.isqrt(table.shape[1])
    c = table.shape[-1]
    table = table.reshape(1, g, g, c)
    if (g, g) == tuple(grid):
        return table
    out = F.interpolate(table.permute(0, 3, 1, 2), size=tuple(grid),
                        mode='bicubic', align_corners=False)
    return out.permute(0, 2, 3, 1)


def rel_table(table: Tensor, n: int) -> Tensor:
    """(n, n, d): entry (i, j) is the row for offset i - j of ``table``,
    first resized linearly to 2 n - 1 rows if it has another length."""
    if table.shape[0] != 2 * n - 1:
        table = F.interpolate(table.t()[None], size=2 * n - 1,
                              mode='linear', align_corners=False)[0].t()
    offsets = torch.arange(n)[:, None] - torch.arange(n)[None, :] + n - 1
    return table[offsets]


def attention(sd: Dict[str, Tensor], p: str, x: Tensor, grid: Tuple[int,
                                                                    int],
              num_heads: int, key_mask: Optional[Tensor] = None) -> Tensor:
    """One attention of block prefix ``p`` on tokens (N, gh * gw, C) of an
    (gh, gw) grid; ``key_mask`` (N, gh * gw) True on masked keys."""
    n, length, c = x.shape
    gh, gw = grid
    d = c // num_heads
    qkv = F.linear(x, sd[p + 'attn.qkv.weight'], sd.get(p + 'attn.qkv.bias'))
    q, k, v = qkv.reshape(n, length, 3, num_heads, d).permute(2, 0, 3, 1, 4)
    logits = (q * d**-0.5) @ k.transpose(-2, -1)  # (N, H, L, L)
    rh = rel_table(sd[p + 'attn.rel_pos_h'], gh)  # (gh, gh, d)
    rw = rel_table(sd[p + 'attn.rel_pos_w'], gw)
    qg = q.reshape(n, num_heads, gh, gw, d)
    # q_(y, x) . R_h[y - ky]: (N, H, gh, gw, ky); . R_w[x - kx]: (..., kx)
    by_row = torch.einsum('nhyxc,ykc->nhyxk', qg, rh)
    by_col = torch.einsum('nhyxc,xkc->nhyxk', qg, rw)
    logits = (logits.reshape(n, num_heads, gh, gw, gh, gw) +
              by_row[..., :, None] + by_col[..., None, :]).reshape(
                  n, num_heads, length, length)
    if key_mask is not None:
        key_mask = key_mask & ~key_mask.all(-1, keepdim=True)
        logits = logits.masked_fill(key_mask[:, None, None], float('-inf'))
    out = logits.softmax(-1) @ v  # (N, H, L, d)
    out = out.transpose(1, 2).reshape(n, length, c)
    return F.linear(out, sd[p + 'attn.proj.weight'], sd[p + 'attn.proj.bias'])


def window_attention(sd, p, y, grid, num_heads, s, key_mask=None):
    """Attention in S x S windows, one window at a time: the window's grid
    tokens at their place, zeros elsewhere (unmasked), the grid's tokens of
    the result kept. y (B, h * w, C); key_mask (B, h * w)."""
    b, _, c = y.shape
    h, w = grid
    out = torch.zeros_like(y)
    for i in range(b):
        for r0 in range(0, h, s):
            for c0 in range(0, w, s):
                window = y.new_zeros(1, s * s, c)
                keys = torch.zeros(1, s * s, dtype=torch.bool)
                local, idx = [], []
                for r in range(r0, min(r0 + s, h)):
                    for col in range(c0, min(c0 + s, w)):
                        local.append((r - r0) * s + col - c0)
                        idx.append(r * w + col)
                window[0, local] = y[i, idx]
                if key_mask is not None:
                    keys[0, local] = key_mask[i, idx]
                res = attention(sd, p, window, (s, s), num_heads,
                                keys if key_mask is not None else None)
                out[i, idx] = res[0, local]
    return out


def vit_forward(sd: Dict[str, Tensor], x: Tensor, num_heads: int,
                window_size: int, window_blocks: Sequence[int],
                key_mask: Optional[Tensor] = None) -> Tensor:
    """detectron2's ``ViT`` on images (B, 3, H, W) (H, W multiples of the
    patch): the last block's map (B, C, h, w). ``key_mask`` (B, h, w)."""
    patch_w = sd[NET + 'patch_embed.proj.weight']
    p = patch_w.shape[-1]
    x = F.conv2d(x, patch_w, sd[NET + 'patch_embed.proj.bias'], stride=p)
    b, c, h, w = x.shape
    x = x.permute(0, 2, 3, 1) + get_abs_pos(sd[NET + 'pos_embed'], (h, w))
    x = x.reshape(b, h * w, c)
    flat_mask = None
    if key_mask is not None:
        flat_mask = key_mask.reshape(b, h * w)
        x = x.masked_fill(flat_mask[..., None], 0.)
    depth = len({k.split('.')[3] for k in sd if k.startswith(NET + 'blocks.')})
    for i in range(depth):
        q = f'{NET}blocks.{i}.'
        y = F.layer_norm(x, (c, ), sd[q + 'norm1.weight'],
                         sd[q + 'norm1.bias'], _LN_EPS)
        if i in window_blocks:
            y = window_attention(sd, q, y, (h, w), num_heads, window_size,
                                 flat_mask)
        else:
            y = attention(sd, q, y, (h, w), num_heads, flat_mask)
        x = x + y
        y = F.layer_norm(x, (c, ), sd[q + 'norm2.weight'],
                         sd[q + 'norm2.bias'], _LN_EPS)
        y = F.linear(F.gelu(F.linear(y, sd[q + 'mlp.fc1.weight'],
                                     sd[q + 'mlp.fc1.bias'])),
                     sd[q + 'mlp.fc2.weight'], sd[q + 'mlp.fc2.bias'])
        x = x + y
    return x.transpose(1, 2).reshape(b, c, h, w)


def _ln2d(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """LayerNorm over the channels of an NCHW map."""
    mean = x.mean(1, keepdim=True)
    var = (x - mean).pow(2).mean(1, keepdim=True)
    x = (x - mean) / torch.sqrt(var + _LN_EPS)
    return weight[:, None, None] * x + bias[:, None, None]


def simfp_forward(sd: Dict[str, Tensor], feat: Tensor, patch: int,
                  scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5)
                  ) -> Tuple[Tensor, ...]:
    """detectron2's ``SimpleFeaturePyramid`` (norm 'LN', LastLevelMaxPool)
    on the backbone map: the levels finest first, then the top level."""
    outs = []
    for scale in scale_factors:
        p = f'backbone.simfp_{int(math.log2(patch / scale))}.'
        x, first = feat, 0
        if scale == 4.0:
            x = F.conv_transpose2d(x, sd[p + '0.weight'], sd[p + '0.bias'],
                                   stride=2)
            x = F.gelu(_ln2d(x, sd[p + '1.weight'], sd[p + '1.bias']))
            x = F.conv_transpose2d(x, sd[p + '3.weight'], sd[p + '3.bias'],
                                   stride=2)
            first = 4
        elif scale == 2.0:
            x = F.conv_transpose2d(x, sd[p + '0.weight'], sd[p + '0.bias'],
                                   stride=2)
            first = 1
        elif scale == 0.5:
            x = F.max_pool2d(x, 2, stride=2)
            first = 1
        for j, pad in ((first, 0), (first + 1, 1)):
            x = F.conv2d(x, sd[f'{p}{j}.weight'], padding=pad)
            x = _ln2d(x, sd[f'{p}{j}.norm.weight'], sd[f'{p}{j}.norm.bias'])
        outs.append(x)
    outs.append(F.max_pool2d(outs[-1], 1, stride=2))
    return tuple(outs)
