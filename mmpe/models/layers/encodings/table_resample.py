"""A learnable position table resampled to each image's own grid, as
DINOv2's ``interpolate_pos_encoding`` resamples it to each input.

DINOv2 (Oquab et al. 2024; facebookresearch/dinov2,
``dinov2/models/vision_transformer.py``) keeps one ``M x M`` table (37 x 37
for 518 px at patch 14) and resamples it bicubically to every input's grid
``(n_y, n_x)``, with two settings its hub models fix:

- ``offset``: the sampling ratio is ``M / (n + offset)`` (DINOv2 passes the
  scale factor ``(n + offset) / M`` to ``F.interpolate``, which samples the
  table at ``(o + 1/2) M / (n + offset) - 1/2``); 0.1 for the original
  models, 0 (the output size form) for the models with registers.
- ``antialias``: PyTorch's antialiased bicubic (PIL's kernel, a = -0.5,
  widened by the ratio when shrinking, weights normalised per output) for
  the models with registers, else the plain bicubic of ``upsample_bicubic2d``
  (a = -0.75, taps clamped to the border).

An input of exactly the table's grid gets the table unchanged (DINOv2's
shortcut, also with the offset); the antialiased resize also leaves an axis
of the table's length unchanged (as PyTorch's does).

Each axis is one ``(n_out, M)`` weight matrix, so the resampled grid is
``W_y T W_x^T``. A padded batch gives every image the matrices of its own
valid extent (read from the key padding mask): the image's tokens get the
table its own grid gets alone, whatever the batch; padded rows and columns
continue the image's sampling past its extent (they are masked keys).
The cubic kernel and the plain bicubic's taps live here too
(:func:`cubic_weights`, :func:`cubic_taps`): ``bicubic_resize`` of
:mod:`.pos_embed_2d` reads them.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

def cubic_weights(dist: Tensor, a: float = -0.75) -> Tensor:
    """Keys' cubic convolution kernel ``W(|d|)`` (Keys 1981, Eq. 15), 0 from
    ``|d| = 2`` on; ``a = -0.75`` in PyTorch's plain bicubic, ``-0.5`` in its
    antialiased one (PIL's).

    Args:
        dist (Tensor): Distances ``|d| >= 0``.
        a (float): The kernel's parameter. Defaults to -0.75.
    """
    near = ((a + 2) * dist - (a + 3)) * dist * dist + 1  # |d| <= 1
    far = ((a * dist - 5 * a) * dist + 8 * a) * dist - 4 * a  # 1 < |d| < 2
    return torch.where(dist <= 1, near,
                       torch.where(dist < 2, far, torch.zeros_like(dist)))


def cubic_taps(size: int,
               length,
               device: torch.device,
               dtype: torch.dtype,
               ratio: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Source rows ``(..., length, 4)`` and weights ``(..., length, 4)`` of
    the plain bicubic resize of ``size`` samples to ``length``.

    Output sample ``o`` reads the source at ``s = (o + 0.5) r - 0.5`` with
    ``r = size / length`` or the given ``ratio`` (half-pixel centres, not
    clamped; a ratio is what ``F.interpolate`` uses when given a scale
    factor, ``1 / scale_factor``); with ``t = s - floor(s)`` its taps
    ``floor(s) - 1 .. floor(s) + 2`` (clamped to the source: border
    samples repeated) weigh ``W(t + 1), W(t), W(1 - t), W(2 - t)`` for Keys'
    cubic kernel ``W`` with ``a = -0.75`` (:func:`cubic_weights`):
    PyTorch's ``upsample_bicubic2d``.

    Args:
        size (int): Source samples.
        length (int): Output samples.
        device (torch.device): Output device.
        dtype (torch.dtype): Dtype of the weights.
        ratio (Tensor, optional): ``(..., 1)`` source samples per output
            sample, one per leading index (e.g. per image). None:
            ``size / length``.
    """
    pos = torch.arange(length, device=device, dtype=dtype)
    if ratio is None:
        src = (2 * pos + 1) * size / (2 * length) - 0.5
    else:
        src = (pos + 0.5) * ratio - 0.5
    low = src.floor()
    t = (src - low)[..., None]
    d = torch.cat([t + 1, t, 1 - t, 2 - t], dim=-1)  # distance of each tap
    index = low.long()[..., None] + torch.arange(-1, 3, device=device)
    return index.clamp(0, size - 1), cubic_weights(d)


def aa_bicubic_matrix(size: int, out_len, ratio: Tensor) -> Tensor:
    """Weights ``(B, out_len, size)`` of PyTorch's antialiased bicubic.

    Output ``o`` is centred at ``c = ratio (o + 1/2)`` on the source; source
    sample ``j`` weighs ``K((j + 1/2 - c) / s)`` with ``s = max(ratio, 1)``
    and ``K`` Keys' cubic with ``a = -0.5`` (support 2), normalised over
    ``j`` (``_upsample_bicubic2d_aa``'s ``_compute_weights_aa``).

    Args:
        size (int): Source samples M.
        out_len (int): Output samples.
        ratio (Tensor): ``(B,)`` source samples per output sample.

    Returns:
        Tensor: ``(B, out_len, size)`` in ``ratio``'s dtype.
    """
    ratio = ratio[:, None, None]
    out = torch.arange(out_len, device=ratio.device, dtype=ratio.dtype)
    src = torch.arange(size, device=ratio.device, dtype=ratio.dtype)
    centre = ratio * (out[None, :, None] + 0.5)
    dist = (src[None, None, :] + 0.5 - centre) / ratio.clamp(min=1.)
    weights = cubic_weights(dist.abs(), a=-0.5)
    total = weights.sum(-1, keepdim=True)
    # an output past the source (a padded row beyond an image's extent)
    # has no weight: 0, not 0 / 0
    return torch.where(total > 0, weights / total.clamp(min=1e-12), 0.)


def bicubic_matrix(size: int, out_len, ratio: Tensor) -> Tensor:
    """Weights ``(B, out_len, size)`` of the plain bicubic resize
    (:func:`cubic_taps`: a = -0.75, border taps clamped)
    at ``ratio`` source samples per output sample."""
    rows, weights = cubic_taps(size, out_len, ratio.device, ratio.dtype,
                               ratio=ratio[:, None])
    src = torch.arange(size, device=ratio.device)
    # (B, out_len, 4, 1) == (size,) -> (B, out_len, 4, size): clamped taps
    # that fall on one border sample add up there
    hits = (rows[..., None] == src).to(weights.dtype)
    return (weights[..., None] * hits).sum(-2)


def resample_table_per_image(grid: Tensor,
                             dst_shape: Tuple[int, int],
                             extent: Optional[Tensor] = None,
                             antialias: bool = False,
                             offset: float = 0.) -> Tensor:
    """Resample a ``(C, M_y, M_x)`` table to each image's grid.

    Args:
        grid (Tensor): ``(C, M_y, M_x)`` the table (float32 or float64).
        dst_shape (tuple[int, int]): The (padded) grid ``(h, w)``.
        extent (Tensor, optional): ``(B, 2)`` each image's valid ``(rows,
            cols)`` (:func:`~.rope_coords.valid_extent`). None: one image
            filling the grid.
        antialias (bool): Antialiased (True) or plain bicubic.
        offset (float): DINOv2's ``interpolate_offset``.

    Returns:
        Tensor: ``(B, h * w, C)`` (``B = 1`` without ``extent``), rows
        row-major.
    """
    c, my, mx = grid.shape
    h, w = dst_shape
    dtype = grid.dtype
    if extent is None:
        extent = torch.tensor([[h, w]], device=grid.device)
    extent = extent.to(device=grid.device, dtype=dtype)
    matrix = aa_bicubic_matrix if antialias else bicubic_matrix
    # DINOv2 returns its table unchanged for an input of the table's grid
    same = (extent[:, 0] == my) & (extent[:, 1] == mx)
    mats = []
    for axis, (size, length) in enumerate(((my, h), (mx, w))):
        n = extent[:, axis]
        mat = matrix(size, length, size / (n + offset))
        # PyTorch's antialiased resize leaves an axis of unchanged length as
        # it is, whatever the scale factor
        keep = same | (n == size) if antialias else same
        eye = torch.eye(length, size, device=grid.device, dtype=dtype)
        mats.append(torch.where(keep[:, None, None], eye, mat))
    mat_y, mat_x = mats
    # (B, h, M_y) x (C, M_y, M_x) x (B, w, M_x) -> (B, h, w, C)
    out = torch.einsum('bim,cmn,bjn->bijc', mat_y, grid, mat_x)
    return out.reshape(out.shape[0], h * w, c)
