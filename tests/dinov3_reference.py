"""DINOv3's patch-centre coordinates written out one token at a time: the
reference that the RoPE coordinate tests of the layer and of the backbone
compare against (facebookresearch/dinov3,
``dinov3/layers/rope_position_encoding.py``)."""
import torch


def dinov3_coords(h, w, normalize):
    """``(h * w, 2)`` positions ``(y, x)`` of an ``(h, w)`` grid, rows
    first: ``2 (i + 0.5) / n - 1`` per axis, ``n`` the axis length
    (``'separate'``), the longer (``'max'``) or the shorter (``'min'``)
    side."""
    n = dict(separate=(h, w), max=(max(h, w), ) * 2,
             min=(min(h, w), ) * 2)[normalize]
    out = torch.empty(h * w, 2, dtype=torch.float64)
    for r in range(h):
        for c in range(w):
            out[r * w + c, 0] = 2 * (r + 0.5) / n[0] - 1
            out[r * w + c, 1] = 2 * (c + 0.5) / n[1] - 1
    return out
