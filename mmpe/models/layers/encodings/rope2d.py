"""2D rotary position embedding (axial RoPE) for attention on a token grid.

References: Su et al., "RoFormer" (arXiv:2104.09864), Eq. 34 (rotation of
q and k so that q_m . k_n depends on m - n); Heo et al., "Rotary Position
Embedding for Vision Transformer", ECCV 2024, Eq. 10-11 (RoPE-Axial: half
of the channels rotate with x, half with y).
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from ..common.arg_checks import check_grid
from ..common.cache import BoundedCache
from .rope_coords import index_coords


def rope2d_tables(pos: Tensor,
                  head_dim: int,
                  theta: float = 100.,
                  dtype: torch.dtype = torch.float32) -> Tuple[Tensor, Tensor]:
    """Cos/sin tables of axial 2D RoPE for tokens at positions ``pos``.

    The head channels are split as ``[x half | y half]``; each half of
    ``D / 2`` channels holds ``Q = D / 4`` rotated pairs ``(j, j + Q)``
    ("rotate-half" layout), pair j at frequency ``theta ** (-j / Q)``. The
    token at ``(y, x)`` is rotated by ``x * freq_j`` in the x half and
    ``y * freq_j`` in the y half. With normalised positions ``2 pi p``
    (:mod:`.rope_coords`) this is DINOv3's table with ``base = theta``
    (periods ``theta ** (j / Q)``).

    Args:
        pos (Tensor): ``(..., L, 2)`` positions ``(y, x)``
            (:mod:`.rope_coords`).
        head_dim (int): Channels per head D, a multiple of 4.
        theta (float): Frequency base. Defaults to 100 (Heo et al.).
        dtype (torch.dtype): Output dtype (computed in at least float32).

    Returns:
        tuple[Tensor, Tensor]: ``cos`` and ``sin``, each ``(..., L, D)``.
    """
    if head_dim % 4 != 0:
        raise ValueError(f'rope2d: the head dim (embed_dims / num_heads) '
                         f'must be a multiple of 4, got {head_dim}')
    quarter = head_dim // 4
    # float32 at least: half-precision angles of large positions are wrong
    fdtype = torch.float64 if dtype == torch.float64 else torch.float32
    pos = pos.to(fdtype)
    freqs = theta**(-torch.arange(quarter, device=pos.device, dtype=fdtype) /
                    quarter)
    # (..., L, 1) * (Q, ) -> (..., L, Q)
    ang_x = pos[..., 1:2] * freqs
    ang_y = pos[..., 0:1] * freqs
    # each angle serves both members of its pair: (..., L, 4Q) = (..., L, D)
    angles = torch.cat([ang_x, ang_x, ang_y, ang_y], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def build_rope2d(hw_shape: Tuple[int, int],
                 head_dim: int,
                 theta: float = 100.,
                 device: Optional[torch.device] = None,
                 dtype: torch.dtype = torch.float32) -> Tuple[Tensor, Tensor]:
    """Cos/sin tables of axial 2D RoPE for an ``(h, w)`` grid of integer
    token positions (:func:`rope2d_tables` of
    :func:`~.rope_coords.index_coords`).

    Args:
        hw_shape (tuple[int, int]): Grid ``(h, w)``.
        head_dim (int): Channels per head D, a multiple of 4.
        theta (float): Frequency base. Defaults to 100 (Heo et al.).
        device (torch.device, optional): Output device.
        dtype (torch.dtype): Output dtype (computed in at least float32).

    Returns:
        tuple[Tensor, Tensor]: ``cos`` and ``sin``, each ``(h * w, D)`` in
        row-major token order.
    """
    fdtype = torch.float64 if dtype == torch.float64 else torch.float32
    return rope2d_tables(
        index_coords(hw_shape, device, fdtype), head_dim, theta, dtype)


def _rotate_half_axial(x: Tensor) -> Tensor:
    """``[a, b, c, d] -> [-b, a, -d, c]`` on the last dim (four quarters)."""
    a, b, c, d = x.chunk(4, dim=-1)
    return torch.cat([-b, a, -d, c], dim=-1)


def apply_rope2d(x: Tensor, cos: Tensor, sin: Tensor,
                 num_skip: int = 0) -> Tensor:
    """Rotate queries or keys with axial 2D RoPE; skip tokens untouched.

    Each pair ``(u, v)`` becomes ``(u cos - v sin, v cos + u sin)``
    (RoFormer Eq. 34), so ``<R_m q, R_n k> = <q, R_{n - m} k>`` depends only
    on the offset between the two tokens.

    Args:
        x (Tensor): ``(B, num_heads, num_skip + h * w, D)``.
        cos (Tensor): ``(h * w, D)`` from :func:`build_rope2d`, or any
            shape that broadcasts against the grid tokens of ``x``:
            ``(num_heads, h * w, D)`` (per-head, RoPE-Mixed),
            ``(B, 1, h * w, D)`` / ``(B, num_heads, h * w, D)`` (per image,
            e.g. normalised coordinates of a padded batch).
        sin (Tensor): Same shape as ``cos``.
        num_skip (int): Leading tokens (class token) left unrotated.
            Defaults to 0.

    Returns:
        Tensor: Same shape and dtype as ``x``.
    """
    if x.shape[-2] != num_skip + cos.shape[-2]:
        raise ValueError(
            f'rope2d: sequence length {x.shape[-2]} != num_skip + h * w = '
            f'{num_skip} + {cos.shape[-2]}')
    skip, grid = x[..., :num_skip, :], x[..., num_skip:, :]
    cos, sin = cos.to(grid.dtype), sin.to(grid.dtype)
    grid = grid * cos + _rotate_half_axial(grid) * sin
    return torch.cat([skip, grid], dim=-2) if num_skip else grid


class RoPE2D(nn.Module):
    """Axial 2D RoPE tables for one head size: of integer token positions
    (:func:`build_rope2d`, cached per ``(h, w, device, dtype)``) or of given
    positions (:func:`rope2d_tables`, e.g. normalised per image; not
    cached).

    Holds no parameters.

    Args:
        head_dim (int): Channels per head, a multiple of 4.
        theta (float): Frequency base. Defaults to 100.
        cache_size (int): Grids kept in the cache. Defaults to 16.
    """

    def __init__(self,
                 head_dim: int,
                 theta: float = 100.,
                 cache_size: int = 16) -> None:
        super().__init__()
        if head_dim % 4 != 0:
            raise ValueError(
                f"pos_encoding='rope2d' needs the head dim (embed_dims / "
                f'num_heads) to be a multiple of 4, got {head_dim}')
        if theta <= 0:
            raise ValueError(f'rope2d: `theta` must be > 0, got {theta}')
        self.head_dim = head_dim
        self.theta = float(theta)
        self.cache = BoundedCache(cache_size)

    def forward(self,
                hw_shape: Tuple[int, int],
                device: torch.device,
                dtype: torch.dtype,
                pos: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Return ``(cos, sin)`` of the ``(h, w)`` grid.

        Args:
            hw_shape (tuple[int, int]): Grid ``(h, w)``.
            device (torch.device): Output device.
            dtype (torch.dtype): Output dtype.
            pos (Tensor, optional): ``(h * w, 2)`` or ``(B, h * w, 2)``
                positions ``(y, x)`` (:class:`~.rope_coords.RoPECoords`).
                None: the integer token positions (cached tables).

        Returns:
            tuple[Tensor, Tensor]: Each ``(h * w, head_dim)`` (integer or
            shared positions) or ``(B, 1, h * w, head_dim)`` (per image,
            broadcasting over heads).
        """
        h, w = check_grid(*hw_shape)
        if pos is None:
            return self.cache.get(
                (h, w, device, dtype), lambda: build_rope2d(
                    (h, w), self.head_dim, self.theta, device, dtype))
        cos, sin = rope2d_tables(
            pos.to(device), self.head_dim, self.theta, dtype)
        if pos.dim() == 3:  # (B, L, D) -> (B, 1, L, D): one table per image
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return cos, sin

    def extra_repr(self) -> str:
        return f'head_dim={self.head_dim}, theta={self.theta}'
