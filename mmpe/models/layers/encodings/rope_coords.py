"""Token coordinates for 2D rotary embeddings: integer indices, or patch
centres normalised to each image's valid extent (DINOv3), with DINOv3's
training-time coordinate augmentations.

Siméoni et al., "DINOv3" (arXiv:2508.10104), Sec. 3.1 and its
``RopePositionEmbedding``: the token in row ``r`` and column ``c`` of an
``(H, W)`` grid sits at the patch centre

.. math::

    p^y = 2 \\frac{r + 1/2}{n_y} - 1, \\qquad
    p^x = 2 \\frac{c + 1/2}{n_x} - 1,

with ``(n_y, n_x) = (H, W)`` (``normalize='separate'``: each axis spans
``[-1, 1]``), ``(max(H, W), max(H, W))`` (``'max'``: the longer side spans
``[-1, 1]``, the shorter starts at -1 and stops short of 1) or
``(min(H, W), min(H, W))`` (``'min'``: the shorter side spans ``[-1, 1]``,
the longer goes beyond 1). A larger image gives denser positions in the
same range, not wider ones. During training the coordinates of a batch are
augmented in DINOv3's order: ``+ s`` with ``s ~ U[-shift, shift]`` per axis,
then ``* j`` with ``log j ~ U[-log jitter, log jitter]`` per axis, then
``* r`` with ``log r ~ U[-log rescale, log rescale]`` shared by both axes.
DINOv3 turns a coordinate ``p`` into angles ``2 pi p / period``; the rotary
modules here multiply positions by frequencies, so the normalised
positions they get are ``2 pi p`` (:data:`NORMALIZED_SCALE`) and a frequency
``f`` is DINOv3's ``1 / period``.

In a padded batch (mmdet pads bottom/right), ``(H, W)`` is each image's
*valid* token extent, read from the key padding mask as mmdet's sine
encoding does, so an image's coordinates do not depend on the other images
of its batch. Integer indices (``coords='index'``, Heo et al., ECCV 2024)
need no extent: the token at ``(r, c)`` is at ``(r, c)`` in any batch.

Every position tensor holds ``(y, x)`` pairs in its last dimension (row
first, DINOv3's ``'ij'`` order), tokens row-major.
"""
import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from ..common.arg_checks import check_choice

#: How token positions are made (``rope_cfg['coords']``).
COORDS_CHOICES = ('index', 'normalized')
#: Which extent normalised coordinates divide by (``rope_cfg['normalize']``).
NORMALIZE_CHOICES = ('separate', 'max', 'min')
#: The coordinate arguments of a rotary config and their defaults.
COORD_DEFAULTS = dict(
    coords='index', normalize='separate', shift=0., jitter=1., rescale=1.)
#: The arguments of each rotary type besides ``type`` (``encoder_pe.relative``
#: of the DETR family, ``rope_cfg`` of the CPVT backbone): the frequency base,
#: RoPE-Mixed's random initial directions, the coordinates.
ROPE_ARGS = {
    'rope2d': ('theta', ) + tuple(COORD_DEFAULTS),
    'rope-mixed': ('theta', 'rotate') + tuple(COORD_DEFAULTS)
}
#: Normalised coordinates reach the rotary modules as ``2 pi p``: DINOv3's
#: angle ``2 pi p / period`` is then ``position * frequency``.
NORMALIZED_SCALE = 2 * math.pi


def check_coord_args(coords: str = 'index',
                     normalize: str = 'separate',
                     shift: float = 0.,
                     jitter: float = 1.,
                     rescale: float = 1.,
                     prefix: str = '') -> None:
    """Raise a ValueError naming the key, its value and what is valid.

    Args:
        coords (str): One of :data:`COORDS_CHOICES`.
        normalize (str): One of :data:`NORMALIZE_CHOICES`.
        shift (float): >= 0.
        jitter (float): >= 1.
        rescale (float): >= 1.
        prefix (str): Prepended to the key in the message, e.g.
            ``'encoder_pe.relative.'``.
    """
    check_choice(f'{prefix}coords', coords, COORDS_CHOICES)
    check_choice(f'{prefix}normalize', normalize, NORMALIZE_CHOICES)
    for key, value, low in (('shift', shift, 0.), ('jitter', jitter, 1.),
                            ('rescale', rescale, 1.)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < low:
            raise ValueError(
                f'Unsupported `{prefix}{key}` {value!r}, please choose a '
                f'finite number >= {low:g} ({low:g}: off)')


def index_coords(hw_shape: Tuple[int, int],
                 device: Optional[torch.device] = None,
                 dtype: torch.dtype = torch.float32) -> Tensor:
    """Integer token positions ``(h * w, 2)``: token ``r * w + c`` is at
    ``(y, x) = (r, c)``."""
    h, w = hw_shape
    ys, xs = torch.meshgrid(
        torch.arange(h, device=device, dtype=dtype),
        torch.arange(w, device=device, dtype=dtype),
        indexing='ij')
    # (h, w, 2) -> (h * w, 2), row-major
    return torch.stack([ys, xs], dim=-1).reshape(-1, 2)


def valid_extent(key_padding_mask: Tensor,
                 hw_shape: Tuple[int, int]) -> Tensor:
    """Each image's valid ``(rows, cols)`` from a bottom/right padding mask.

    Args:
        key_padding_mask (Tensor): ``(B, h * w)`` bool, True at padding;
            each image's valid tokens form a top-left rectangle.
        hw_shape (tuple[int, int]): The padded grid ``(h, w)``.

    Returns:
        Tensor: ``(B, 2)`` int64 ``(rows, cols)``: the valid tokens of the
        first column and of the first row (mmdet's sine encoding reads the
        same counts, as the last values of its cumulative sums).
    """
    h, w = hw_shape
    valid = ~key_padding_mask.view(-1, h, w)  # (B, h, w)
    return torch.stack([valid[:, :, 0].sum(1), valid[:, 0, :].sum(1)], -1)


def normalized_coords(hw_shape: Tuple[int, int],
                      extent: Optional[Tensor] = None,
                      normalize: str = 'separate',
                      device: Optional[torch.device] = None,
                      dtype: torch.dtype = torch.float32) -> Tensor:
    """DINOv3's patch-centre coordinates (module docstring), per image.

    Args:
        hw_shape (tuple[int, int]): The (padded) grid ``(h, w)``.
        extent (Tensor, optional): ``(B, 2)`` each image's valid
            ``(rows, cols)`` (:func:`valid_extent`). None: the whole grid
            for one image.
        normalize (str): ``'separate'``, ``'max'`` or ``'min'``.
        device (torch.device, optional): Output device (defaults to
            ``extent``'s).
        dtype (torch.dtype): Output dtype.

    Returns:
        Tensor: ``(B, h * w, 2)`` positions ``(y, x)`` (``B = 1`` without
        ``extent``). Padded tokens continue their image's grid beyond its
        extent (they are masked as keys).
    """
    check_choice('normalize', normalize, NORMALIZE_CHOICES)
    h, w = hw_shape
    if extent is None:
        extent = torch.tensor([[h, w]], device=device)
    device = extent.device if device is None else device
    extent = extent.to(device=device, dtype=dtype)
    ny, nx = extent[:, 0], extent[:, 1]  # (B,) each
    if normalize == 'max':
        ny = nx = torch.maximum(ny, nx)
    elif normalize == 'min':
        ny = nx = torch.minimum(ny, nx)
    rows = torch.arange(h, device=device, dtype=dtype) + 0.5
    cols = torch.arange(w, device=device, dtype=dtype) + 0.5
    # in [0, 1] over the extent, then [-1, 1], DINOv3's order
    cy = 2.0 * (rows[None] / ny[:, None]) - 1.0  # (B, h)
    cx = 2.0 * (cols[None] / nx[:, None]) - 1.0  # (B, w)
    batch = extent.shape[0]
    coords = torch.stack([
        cy[:, :, None].expand(batch, h, w),
        cx[:, None, :].expand(batch, h, w)
    ], dim=-1)  # (B, h, w, 2)
    return coords.reshape(batch, -1, 2)


def augment_coords(coords: Tensor,
                   shift: float = 0.,
                   jitter: float = 1.,
                   rescale: float = 1.) -> Tensor:
    """DINOv3's training-time coordinate augmentation, one draw per call.

    In DINOv3's order, each step only when on: add ``s ~ U[-shift, shift]``
    per axis (2 draws); multiply by ``exp(U[-log jitter, log jitter])`` per
    axis (2 draws); multiply both axes by ``exp(U[-log rescale,
    log rescale])`` (1 draw). The draws are float32 from torch's default
    CPU generator (seeded by the runner's ``randomness.seed``), the same on
    every device, and shared by every image and token of ``coords``.

    Args:
        coords (Tensor): ``(..., 2)`` positions ``(y, x)``.
        shift (float): Largest shift per axis; 0 is off.
        jitter (float): Largest per-axis factor ``>= 1``; 1 is off.
        rescale (float): Largest shared factor ``>= 1``; 1 is off.

    Returns:
        Tensor: Augmented positions, same shape and dtype.
    """
    if shift > 0:
        offset = torch.empty(2).uniform_(-shift, shift)
        coords = coords + offset.to(coords)
    if jitter > 1:
        bound = math.log(jitter)
        scale = torch.empty(2).uniform_(-bound, bound).exp()
        coords = coords * scale.to(coords)
    if rescale > 1:
        bound = math.log(rescale)
        scale = torch.empty(1).uniform_(-bound, bound).exp()
        coords = coords * scale.to(coords)
    return coords


class RoPECoords(nn.Module):
    """The positions a batch's rotary tables are built from.

    One instance per model (a DETR encoder, a backbone): its ``forward`` is
    called once per batch and the result goes to every rotary layer, so
    all layers see the same (augmented) coordinates. A backbone augmenting
    as DINOv3 calls it once per block instead (DINOv3's ViT calls its
    ``rope_embed`` in every block: ``dinov3/models/vision_transformer.py``),
    so each block gets its own draw. Holds no parameters or buffers.

    Args:
        coords (str): ``'index'`` (integer token positions; the default,
            Heo et al.) or ``'normalized'`` (DINOv3's patch centres in
            ``[-1, 1]`` of each image's valid extent).
        normalize (str): For ``'normalized'``: ``'separate'`` (each axis by
            its own extent), ``'max'`` (both by the longer side) or
            ``'min'`` (both by the shorter side). Defaults to
            ``'separate'``.
        shift (float): Training only: largest random shift per axis, in
            coordinate units (normalised: half-extents; index: tokens).
            0 (default) is off.
        jitter (float): Training only: largest random per-axis factor
            (log-uniform in ``[1 / jitter, jitter]``). 1 (default) is off.
        rescale (float): Training only: largest random factor shared by
            both axes (log-uniform in ``[1 / rescale, rescale]``; DINOv3's
            released configs use 2). 1 (default) is off.
        prefix (str): Where these keys live in the user's config, for error
            messages. Defaults to ``''``.
        scale (float | tuple[float, float]): Factor of the positions, one
            or per axis ``(y, x)``, before the augmentations: EVA-02's
            integer positions "interpolated" from its pretraining grid to
            another (``pt_seq_len / ft_seq_len``, ``VisionRotaryEmbeddingFast``
            of its ``det`` code; timm's ``ref_feat_shape / feat_shape``).
            Defaults to 1.
    """

    def __init__(self,
                 coords: str = 'index',
                 normalize: str = 'separate',
                 shift: float = 0.,
                 jitter: float = 1.,
                 rescale: float = 1.,
                 prefix: str = '',
                 scale=1.) -> None:
        super().__init__()
        check_coord_args(coords, normalize, shift, jitter, rescale, prefix)
        scale = tuple(scale) if isinstance(scale, (list, tuple)) else (
            scale, scale)
        if len(scale) != 2 or not all(
                isinstance(s, (int, float)) and not isinstance(s, bool)
                and math.isfinite(s) and s > 0 for s in scale):
            raise ValueError(
                f'Unsupported `{prefix}scale` {scale!r}, please choose a '
                'finite number > 0 or a pair (y, x) of them')
        self.scale = tuple(float(s) for s in scale)
        self.coords = coords
        self.normalize = normalize
        self.shift = float(shift)
        self.jitter = float(jitter)
        self.rescale = float(rescale)

    @property
    def augments(self) -> bool:
        """Whether this call augments (training mode, an augmentation on)."""
        return self.training and (self.shift > 0 or self.jitter > 1
                                  or self.rescale > 1)

    def forward(self,
                hw_shape: Sequence[int],
                key_padding_mask: Optional[Tensor] = None,
                device: Optional[torch.device] = None,
                dtype: torch.dtype = torch.float32) -> Optional[Tensor]:
        """Positions for the rotary modules, or None for integer indices.

        Args:
            hw_shape (tuple[int, int]): The padded grid ``(h, w)`` (ints,
                or symbolic sizes while tracing).
            key_padding_mask (Tensor, optional): ``(B, h * w)`` bool, True
                at padding; None: every image fills the grid.
            device (torch.device, optional): Output device (defaults to the
                mask's, else the CPU).
            dtype (torch.dtype): Output dtype; float32 (default) or float64
                (half-precision positions of large grids are wrong).

        Returns:
            Tensor or None: ``(B, h * w, 2)`` positions ``(y, x)``
            (``2 pi`` times the normalised coordinates), ``(h * w, 2)``
            augmented indices, or None when the positions are the plain
            integer indices (the rotary modules' cached tables of the grid
            apply: the same numbers).
        """
        if self.coords == 'index' and not self.augments and \
                self.scale == (1., 1.):
            return None
        if device is None and key_padding_mask is not None:
            device = key_padding_mask.device
        h, w = hw_shape
        if self.coords == 'index':
            pos = index_coords((h, w), device, dtype)
        else:
            extent = None
            if key_padding_mask is not None:
                extent = valid_extent(key_padding_mask, (h, w))
            pos = normalized_coords((h, w), extent, self.normalize, device,
                                    dtype)
        if self.scale != (1., 1.):
            pos = pos * torch.tensor(self.scale, dtype=pos.dtype,
                                     device=pos.device)
        if self.augments:
            pos = augment_coords(pos, self.shift, self.jitter, self.rescale)
        if self.coords == 'normalized':
            pos = pos * NORMALIZED_SCALE
        return pos

    def extra_repr(self) -> str:
        return (f'coords={self.coords!r}, normalize={self.normalize!r}, '
                f'shift={self.shift}, jitter={self.jitter}, '
                f'rescale={self.rescale}, scale={self.scale}')
