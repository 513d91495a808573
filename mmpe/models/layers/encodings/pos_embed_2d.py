"""Absolute 2D position embeddings: fixed sin-cos, resampled learnable tables.

Pure functions build the tables; :class:`SinCosPosEmbed2D` only caches them
per grid so a stream of differently sized batches does not rebuild them.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..common.arg_checks import check_grid
from ..common.cache import BoundedCache
from .table_resample import cubic_taps, resample_table_per_image


def build_sincos_pos_embed_2d(hw_shape: Tuple[int, int],
                              embed_dims: int,
                              temperature: float = 10000.,
                              device: Optional[torch.device] = None,
                              dtype: torch.dtype = torch.float32) -> Tensor:
    """Fixed 2D sin-cos position embedding of an ``(h, w)`` grid.

    The 1D Transformer embedding (Vaswani et al., 2017, Sec. 3.5) applied to
    the column index x and the row index y, each on a quarter of the
    channels (as MoCo v3 / MAE). With ``D = embed_dims / 4`` and
    ``omega_i = temperature ** (-i / D)`` for ``i < D``, the token at row y,
    column x gets::

        [sin(x * omega), cos(x * omega), sin(y * omega), cos(y * omega)]

    Positions are integer token coordinates, so a token keeps its embedding
    whatever the grid size (bottom/right padding does not move it).

    Args:
        hw_shape (tuple[int, int]): Grid ``(h, w)``.
        embed_dims (int): Channels C, a multiple of 4.
        temperature (float): Frequency base. Defaults to 10000.
        device (torch.device, optional): Output device.
        dtype (torch.dtype): Output dtype (computed in at least float32).

    Returns:
        Tensor: ``(h * w, C)`` in row-major token order.
    """
    if embed_dims % 4 != 0:
        raise ValueError(f'sin-cos 2D embedding: `embed_dims` must be a '
                         f'multiple of 4, got {embed_dims}')
    h, w = hw_shape
    quarter = embed_dims // 4
    # float32 at least: half-precision angles of large positions are wrong
    fdtype = torch.float64 if dtype == torch.float64 else torch.float32
    omega = torch.arange(quarter, device=device, dtype=fdtype) / quarter
    omega = temperature**(-omega)
    ys, xs = torch.meshgrid(
        torch.arange(h, device=device, dtype=fdtype),
        torch.arange(w, device=device, dtype=fdtype),
        indexing='ij')
    # (h*w, 1) * (1, quarter) -> (h*w, quarter)
    out_x = xs.reshape(-1, 1) * omega[None]
    out_y = ys.reshape(-1, 1) * omega[None]
    table = torch.cat(
        [out_x.sin(), out_x.cos(),
         out_y.sin(), out_y.cos()], dim=1)
    return table.to(dtype)


def resample_pos_embed(pos_embed: Tensor,
                       src_shape: Tuple[int, int],
                       dst_shape: Tuple[int, int],
                       num_skip: int = 0,
                       mode: str = 'bicubic',
                       antialias: bool = True,
                       in_float32: bool = True,
                       per_image: bool = False,
                       offset: float = 0.,
                       extent: Optional[Tensor] = None) -> Tensor:
    """Resample a learnable position table to another grid (DeiT / timm).

    The patch part of the table is reshaped to its ``src_shape`` grid and
    interpolated (bicubic, ``align_corners=False``, as DeiT's fine-tuning at
    384 and timm's ``resample_abs_pos_embed``); the ``num_skip`` leading
    entries (class token) are kept as they are. At ``dst_shape ==
    src_shape`` the table is returned unchanged. :data:`POS_EMBED_INTERPS`
    names the settings in use (timm's, detectron2's ``get_abs_pos``,
DINOv2's two ``interpolate_pos_encoding`` settings).

    Args:
        pos_embed (Tensor): ``(1, num_skip + h0 * w0, C)``.
        src_shape (tuple[int, int]): ``(h0, w0)`` of the table.
        dst_shape (tuple[int, int]): Target grid ``(h, w)``.
        num_skip (int): Leading entries not on the grid. Defaults to 0.
        mode (str): ``F.interpolate`` mode. Defaults to 'bicubic'.
        antialias (bool): PyTorch's antialiased bicubic (the kernel of
            PIL, a = -0.5, widened when shrinking) rather than the plain
            one (a = -0.75, :func:`bicubic_resize`); the two differ when
            enlarging too. Defaults to True.
        in_float32 (bool): Interpolate in float32 whatever the table's
            dtype (as timm); False: in the table's dtype, float32 at least
            (as detectron2, which interpolates the parameter itself).
            Defaults to True.
        per_image (bool): Resample bicubically to each image's valid
            ``extent`` with :func:`~.table_resample.resample_table_per_image`
            (DINOv2; ``mode`` bicubic, ``antialias`` and ``offset`` as
            there). Defaults to False.
        offset (float): DINOv2's ``interpolate_offset`` (only with
            ``per_image``). Defaults to 0.
        extent (Tensor, optional): ``(B, 2)`` each image's valid ``(rows,
            cols)`` (only with ``per_image``; None: the whole grid).

    Returns:
        Tensor: ``(1, num_skip + h * w, C)`` (``(B, ...)`` per image), same
        dtype as the input.
    """
    h0, w0 = src_shape
    if pos_embed.shape[1] != num_skip + h0 * w0:
        raise ValueError(
            f'resample_pos_embed: table length {pos_embed.shape[1]} != '
            f'num_skip + h0 * w0 = {num_skip} + {h0} * {w0}')
    if tuple(dst_shape) == (h0, w0) and (not per_image or extent is None):
        return pos_embed
    c = pos_embed.shape[-1]
    skip, grid = pos_embed[:, :num_skip], pos_embed[:, num_skip:]
    # (1, h0*w0, C) -> (1, C, h0, w0); never interpolate in half precision
    dtype = torch.float32 if in_float32 else torch.promote_types(
        pos_embed.dtype, torch.float32)
    grid = grid.reshape(1, h0, w0, c).permute(0, 3, 1, 2).to(dtype)
    if per_image:
        grid = resample_table_per_image(grid[0], dst_shape, extent,
                                        antialias, offset)
        skip = skip.expand(grid.shape[0], -1, -1)
        return torch.cat([skip, grid.to(pos_embed.dtype)], dim=1)
    if mode == 'bicubic' and not antialias:
        grid = bicubic_resize(grid, dst_shape)
    else:
        kwargs = {}
        if mode in ('bilinear', 'bicubic'):
            kwargs = dict(align_corners=False, antialias=antialias)
        grid = F.interpolate(grid, size=tuple(dst_shape), mode=mode,
                             **kwargs)
    # (1, C, h, w) -> (1, h*w, C)
    grid = grid.flatten(2).transpose(1, 2).to(pos_embed.dtype)
    return torch.cat([skip, grid], dim=1)


def bicubic_resize(grid: Tensor, dst_shape: Tuple[int, int]) -> Tensor:
    """``F.interpolate(grid, dst_shape, mode='bicubic', align_corners=False)``
    (no antialias), as gathers and sums per axis: the same values (to
    rounding), and a graph of plain ops for any (symbolic) size, which
    inductor compiles where its lowering of the operator fails on sizes of
    padded grids.

    Args:
        grid (Tensor): ``(N, C, h0, w0)``.
        dst_shape (tuple[int, int]): ``(h, w)``.

    Returns:
        Tensor: ``(N, C, h, w)``.
    """
    rows, row_w = cubic_taps(grid.shape[2], dst_shape[0], grid.device,
                              grid.dtype)
    cols, col_w = cubic_taps(grid.shape[3], dst_shape[1], grid.device,
                              grid.dtype)
    # (N, C, h, 4, w0) -> (N, C, h, w0)
    grid = (grid[:, :, rows] * row_w[:, :, None]).sum(3)
    # (N, C, h, w, 4) -> (N, C, h, w)
    return (grid[:, :, :, cols] * col_w).sum(-1)


#: How a learnable table is resampled to another grid, as keyword arguments
#: of :func:`resample_pos_embed`: ``'timm'`` (``resample_abs_pos_embed``:
#: antialiased bicubic in float32) or ``'detectron2'`` (ViTDet's
#: ``get_abs_pos``: plain bicubic, ``align_corners=False``, in the table's
#: dtype, by :func:`bicubic_resize`; its class-token row is dropped when the
#: weights are converted), ``'dinov2'`` / ``'dinov2-reg'`` (DINOv2's
#: ``interpolate_pos_encoding`` of its hub models without / with registers:
#: plain bicubic at ``M / (n + 0.1)`` / antialiased at ``M / n``, in float32,
#: to each image's valid grid, :mod:`.table_resample`).
POS_EMBED_INTERPS = {
    'timm': dict(mode='bicubic', antialias=True, in_float32=True),
    'detectron2': dict(mode='bicubic', antialias=False, in_float32=False),
    'dinov2': dict(mode='bicubic', antialias=False, in_float32=True,
                   per_image=True, offset=0.1),
    'dinov2-reg': dict(mode='bicubic', antialias=True, in_float32=True,
                       per_image=True, offset=0.),
}


class SinCosPosEmbed2D(nn.Module):
    """Cached :func:`build_sincos_pos_embed_2d` for a fixed channel count.

    Holds no parameters; tables are cached per ``(h, w, device, dtype)``.

    Args:
        embed_dims (int): Channels C, a multiple of 4.
        temperature (float): Frequency base. Defaults to 10000.
        cache_size (int): Grids kept in the cache. Defaults to 16.
    """

    def __init__(self,
                 embed_dims: int,
                 temperature: float = 10000.,
                 cache_size: int = 16) -> None:
        super().__init__()
        if embed_dims % 4 != 0:
            raise ValueError(
                f"pos_encoding='sine' needs `embed_dims` to be a multiple of "
                f'4, got {embed_dims}')
        if temperature <= 0:
            raise ValueError(f'sin-cos 2D embedding: `temperature` must be '
                             f'> 0, got {temperature}')
        self.embed_dims = embed_dims
        self.temperature = float(temperature)
        self.cache = BoundedCache(cache_size)

    def forward(self, hw_shape: Tuple[int, int], device: torch.device,
                dtype: torch.dtype) -> Tensor:
        """Return the ``(h * w, C)`` table for the grid ``hw_shape``."""
        h, w = check_grid(*hw_shape)
        return self.cache.get(
            (h, w, device, dtype), lambda: build_sincos_pos_embed_2d(
                (h, w), self.embed_dims, self.temperature, device, dtype))

    def extra_repr(self) -> str:
        return (f'embed_dims={self.embed_dims}, '
                f'temperature={self.temperature}')
