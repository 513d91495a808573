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

from .arg_checks import check_grid
from .cache import BoundedCache


def build_rope2d(hw_shape: Tuple[int, int],
                 head_dim: int,
                 theta: float = 100.,
                 device: Optional[torch.device] = None,
                 dtype: torch.dtype = torch.float32) -> Tuple[Tensor, Tensor]:
    """Cos/sin tables of axial 2D RoPE for an ``(h, w)`` grid.

    The head channels are split as ``[x half | y half]``; each half of
    ``D / 2`` channels holds ``Q = D / 4`` rotated pairs ``(j, j + Q)``
    ("rotate-half" layout), pair j at frequency ``theta ** (-j / Q)``. The
    token at row y, column x is rotated by ``x * freq_j`` in the x half and
    ``y * freq_j`` in the y half.

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
    if head_dim % 4 != 0:
        raise ValueError(f'rope2d: the head dim (embed_dims / num_heads) '
                         f'must be a multiple of 4, got {head_dim}')
    h, w = hw_shape
    quarter = head_dim // 4
    # float32 at least: half-precision angles of large positions are wrong
    fdtype = torch.float64 if dtype == torch.float64 else torch.float32
    freqs = theta**(-torch.arange(quarter, device=device, dtype=fdtype) /
                    quarter)
    ys, xs = torch.meshgrid(
        torch.arange(h, device=device, dtype=fdtype),
        torch.arange(w, device=device, dtype=fdtype),
        indexing='ij')
    # (h*w, 1) * (1, Q) -> (h*w, Q)
    ang_x = xs.reshape(-1, 1) * freqs[None]
    ang_y = ys.reshape(-1, 1) * freqs[None]
    # each angle serves both members of its pair: (h*w, 4Q) = (h*w, D)
    angles = torch.cat([ang_x, ang_x, ang_y, ang_y], dim=1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


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
        cos (Tensor): ``(h * w, D)`` from :func:`build_rope2d`.
        sin (Tensor): ``(h * w, D)`` from :func:`build_rope2d`.
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
    """Cached :func:`build_rope2d` tables for one head size.

    Holds no parameters; ``(cos, sin)`` are cached per
    ``(h, w, device, dtype)``.

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

    def forward(self, hw_shape: Tuple[int, int], device: torch.device,
                dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """Return ``(cos, sin)``, each ``(h * w, head_dim)``."""
        h, w = check_grid(*hw_shape)
        return self.cache.get(
            (h, w, device, dtype), lambda: build_rope2d(
                (h, w), self.head_dim, self.theta, device, dtype))

    def extra_repr(self) -> str:
        return f'head_dim={self.head_dim}, theta={self.theta}'
