"""Per-pair references of the three offset biases, written from their
authors' equations and released code (never from mmpe's tables), for
``tests/test_models/test_layers/test_grid_bias*.py``.

- Swin-V2's log-CPB (Liu et al., CVPR 2022, Eq. 3-4; ``WindowAttention``
  of microsoft/Swin-Transformer ``models/swin_transformer_v2.py``): per pair
  ``(i, j)`` the offsets ``iy - jy``, ``ix - jx``, each scaled by
  ``8 / (S0 - 1)``, ``sign(d) log2(1 + |d|) / log2(8)``, the MLP
  ``W2 relu(W1 c + b1)`` and ``16 sigmoid``; and the authors' own
  vectorised construction (coordinate table, ``relative_position_index``,
  gather), transcribed.
- 2D ALiBi (CROMA, Fuller et al., NeurIPS 2023, ``get_2dalibi`` of the
  released ``use_croma.py``): ALiBi's recursive ``get_slopes`` and
  ``-slope * sqrt(dy^2 + dx^2)`` per pair.
- LookHere (Fuller et al., NeurIPS 2024, GreenCUBIC/lookhere
  ``lookhere.py``): the released head assignment and slopes
  (``get_slopes``, ``get_none_slopes``, grouped by consecutive layout
  names), the direction masks as the released code builds them per query
  (half-planes from coordinate comparisons, triangles from ``np.tri`` of
  the query's two diagonals, written per pair: ``np.tri(N, M, k)[a, b] =
  b <= a + k``), the distance, ``inf`` at masked pairs turned into the
  largest bfloat16, and the sign.
"""
import itertools
import math

import numpy as np
import torch

#: bfloat16's largest value (the released LookHere code's fill)
BF16_MAX = float(torch.finfo(torch.bfloat16).max)


def pairs(grid):
    """Every (i, (iy, ix), j, (jy, jx)) of a row-major grid."""
    h, w = grid
    for i in range(h * w):
        for j in range(h * w):
            yield i, divmod(i, w), j, divmod(j, w)


# ----------------------------------------------------------------- log-CPB
def log_cpb_loop(w1, b1, w2, grid, pretrained):
    """(H, L, L), differentiable in the MLP weights."""
    h0, w0 = pretrained

    def spaced(d, size):
        d = 8.0 * d / (size - 1)
        return math.copysign(math.log2(1 + abs(d)) / math.log2(8), d) \
            if d else 0.0

    n = grid[0] * grid[1]
    cache = {}
    rows = [[None] * n for _ in range(n)]
    for i, (iy, ix), j, (jy, jx) in pairs(grid):
        key = (iy - jy, ix - jx)
        if key not in cache:
            c = torch.tensor([spaced(key[0], h0), spaced(key[1], w0)],
                             dtype=w1.dtype)
            cache[key] = 16 * torch.sigmoid(w2 @ torch.relu(w1 @ c + b1))
        rows[i][j] = cache[key]
    return torch.stack([torch.stack(r, -1) for r in rows], -2)


def swin_v2_window_bias(mlp, window, pretrained):
    """(H, L, L): the authors' ``WindowAttention`` bias of a window, their
    construction transcribed: the log-spaced coordinate table of the
    ``(2 Wh - 1, 2 Ww - 1)`` offsets, the MLP on it, the pairs' index
    ``(iy - jy + Wh - 1) (2 Ww - 1) + ix - jx + Ww - 1``, ``16 sigmoid``."""
    wh, ww = window
    dtype = next(mlp.parameters()).dtype
    ch = torch.arange(-(wh - 1), wh, dtype=dtype)
    cw = torch.arange(-(ww - 1), ww, dtype=dtype)
    table = torch.stack(torch.meshgrid([ch, cw], indexing='ij')).permute(
        1, 2, 0).contiguous().unsqueeze(0)
    table[..., 0] /= pretrained[0] - 1
    table[..., 1] /= pretrained[1] - 1
    table *= 8
    table = torch.sign(table) * torch.log2(table.abs() + 1.0) / np.log2(8)
    coords = torch.stack(torch.meshgrid(
        [torch.arange(wh), torch.arange(ww)], indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)
    rel = rel.contiguous()
    rel[:, :, 0] += wh - 1
    rel[:, :, 1] += ww - 1
    rel[:, :, 0] *= 2 * ww - 1
    index = rel.sum(-1)
    bias_table = mlp(table).view(-1, mlp[-1].out_features)
    bias = bias_table[index.view(-1)].view(wh * ww, wh * ww, -1)
    return 16 * torch.sigmoid(bias.permute(2, 0, 1).contiguous())


# ----------------------------------------------------------------- 2D ALiBi
def croma_slopes(n):
    """ALiBi's ``get_slopes`` as CROMA's ``get_2dalibi`` writes it."""
    def power_of_2(n):
        start = 2**(-2**-(math.log2(n) - 3))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2**math.floor(math.log2(n))
    return power_of_2(closest) + croma_slopes(2 * closest)[0::2][:n - closest]


def alibi_loop(num_heads, grid):
    """(H, L, L): ``-slope * Euclidean distance`` of every pair."""
    slopes = croma_slopes(num_heads)
    n = grid[0] * grid[1]
    out = torch.zeros(num_heads, n, n, dtype=torch.float64)
    for i, (iy, ix), j, (jy, jx) in pairs(grid):
        dist = math.sqrt((iy - jy)**2 + (ix - jx)**2)
        for head, slope in enumerate(slopes):
            out[head, i, j] = dist * slope * -1
    return out


# ----------------------------------------------------------------- LookHere
LAYOUTS = {
    'none': [[]] * 4,
    'zero': [['zero']] * 4,
    'halves': [['up'], ['down'], ['left'], ['right']],
    'corners': [['up', 'left'], ['up', 'right'], ['down', 'left'],
                ['down', 'right']],
    'triangles': [['tri_up'], ['tri_down'], ['tri_left'], ['tri_right']],
    'diagonals': [['diag_up_right'], ['diag_up_left'], ['diag_down_right'],
                  ['diag_down_left']],
    'eighths1': [['tri_up', 'left'], ['tri_down', 'left'],
                 ['tri_left', 'up'], ['tri_right', 'up']],
    'eighths2': [['tri_up', 'right'], ['tri_down', 'right'],
                 ['tri_left', 'down'], ['tri_right', 'down']],
    'zerotriangles': [['zero', 'tri_up'], ['zero', 'tri_down'],
                      ['zero', 'tri_left'], ['zero', 'tri_right']],
}


def lookhere_heads(direction, num_heads):
    """The released code's head names, directions and slopes."""
    sh = direction.split('-')
    dirs = [LAYOUTS[s] for s in sh]
    if num_heads == 6:
        names, heads = [sh[0]] * 4 + [sh[1]] * 2, dirs[0] + dirs[1][:2]
    elif len(sh) == 1:
        names, heads = [sh[0]] * num_heads, dirs[0] * (num_heads // 4)
    elif len(sh) == 2 and num_heads == 12:
        names, heads = [sh[0]] * 8 + [sh[1]] * 4, dirs[0] * 2 + dirs[1]
    elif len(sh) == 3 and num_heads == 12:
        names = [sh[0]] * 4 + [sh[1]] * 4 + [sh[2]] * 4
        heads = dirs[0] + dirs[1] + dirs[2]
    else:
        raise NotImplementedError((direction, num_heads))
    slopes = []
    for k, v in itertools.groupby(names):
        n = len(list(v))
        if 'zero' in k or 'none' in k:
            base = [0.25, 0.0625, 0.015625, 0.00390625]
            slopes += base[:2] if n == 2 else base if n == 4 else list(
                np.repeat(base, n // 4))
        else:
            slopes += list(np.repeat(np.exp2(-np.arange(1, n / 4 + 1)), 4))
    return heads, slopes


def _masked(direction, grid, q, k):
    """Whether the released code's mask of ``direction`` covers the key
    ``k = (y, x)`` of query ``q`` (x the column, y the row)."""
    gy, gx = grid
    (qy, qx), (ky, kx) = q, k
    if direction == 'right':
        return kx < qx
    if direction == 'left':
        return kx > qx
    if direction == 'up':
        return ky > qy
    if direction == 'down':
        return ky < qy
    # the query's diagonals: np.diag offsets of x - y and of the
    # left-right flipped grid
    pos, neg = qx - qy, gx - 1 - qx - qy
    trid = kx <= ky + pos                  # np.tri(gy, gx, k=pos)
    triu = not kx <= ky + pos - 1          # ~np.tri(..., k=pos - 1)
    trir = gx - 1 - kx <= ky + neg         # fliplr(np.tri(..., k=neg))
    tril = not gx - 1 - kx <= ky + neg - 1
    tri = dict(up=not (triu and tril), down=not (trid and trir),
               right=not (triu and trir), left=not (trid and tril))
    if direction.startswith('tri_'):
        return tri[direction[4:]]
    _, a, b = direction.split('_')  # diag_a_b: masked where both are
    return tri[a] and tri[b]


def lookhere_loop(direction, num_heads, grid, distance='linear',
                  global_slope=1.0, layer_slopes=(1.0, 1.0), layer=0,
                  depth=1):
    """(H, L, L): the released bias of one layer, per pair and head."""
    heads, slopes = lookhere_heads(direction, num_heads)
    layer_slope = np.linspace(layer_slopes[0], layer_slopes[1], depth)[layer]
    n = grid[0] * grid[1]
    out = torch.zeros(num_heads, n, n, dtype=torch.float64)
    for i, q, j, k in pairs(grid):
        dist = math.sqrt((q[0] - k[0])**2 + (q[1] - k[1])**2)
        dist = dict(linear=dist, sqrt=dist**0.5, square=dist**2)[distance]
        for head, dirs in enumerate(heads):
            value = 0.0 if 'zero' in dirs else dist
            if any(_masked(d, grid, q, k) for d in dirs if d != 'zero'):
                value = math.inf
            value = global_slope * layer_slope * (slopes[head] * value)
            out[head, i, j] = -min(value, BF16_MAX)
    return out


# ----------------------------------------------------------------- attention
def attention(q, k, v, bias, mask, skip=0):
    """``softmax(q k^T / sqrt(d) + bias + mask) v`` with the (H, L0, L0)
    grid bias placed after ``skip`` tokens (0 for pairs with them) and
    padded keys (``mask`` (B, L), True) at ``-inf``."""
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    full = torch.zeros(logits.shape[1:], dtype=bias.dtype)
    full[:, skip:, skip:] = bias
    logits = logits + full
    if mask is not None:
        logits = logits.masked_fill(mask[:, None, None], float('-inf'))
    return logits.softmax(-1) @ v


def read_rows(bias, mask, skip=0):
    """(B, H, L, 1) float: 0 at the rows whose every unmasked key is
    padding (LookHere's padded queries that look only at padding: they
    attend uniformly to masked keys, and the saved log-sum-exp of SDPA and
    the fused kernels cannot recover that uniform row; no loss reads a
    padded token), 1 elsewhere. Output gradients are taken on these rows
    only."""
    visible = bias > -BF16_MAX / 2  # (H, L0, L0)
    heads, n = visible.shape[0], skip + visible.shape[1]
    full = torch.ones(heads, n, n, dtype=torch.bool)
    full[:, skip:, skip:] = visible
    valid = ~mask[:, None, None, :]  # (B, 1, 1, L)
    seen = (full[None] & valid).any(-1, keepdim=True)  # (B, H, L, 1)
    return seen.to(torch.float64)
