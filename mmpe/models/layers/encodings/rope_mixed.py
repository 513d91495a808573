"""RoPE-Mixed: 2D rotary embedding with learnable frequencies mixing x and y.

Reference: Heo et al., "Rotary Position Embedding for Vision Transformer",
ECCV 2024 (arXiv:2403.13298), Sec. 3.3 "RoPE-Mixed". Each head owns
``D / 2`` frequency vectors ``(theta^x_t, theta^y_t)``; the token at column
``p^x`` and row ``p^y`` rotates its pair t by

.. math::

    \\phi_t(p) = \\theta^x_t p^x + \\theta^y_t p^y,

i.e. :math:`R(n, t) = e^{i(\\theta^x_t p^x_n + \\theta^y_t p^y_n)}`, so
:math:`\\langle R_n q, R_m k\\rangle` depends on :math:`p_n - p_m` only,
for any (learned) frequencies. With :math:`\\theta^y = 0` on half of the
pairs and :math:`\\theta^x = 0` on the other half it reduces to axial RoPE.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from ....utils.arg_checks import check_int, is_int
from ..common.arg_checks import check_grid
from .rope_coords import index_coords


def init_mixed_freqs(head_dim: int,
                     num_heads: int,
                     theta: float = 10.,
                     rotate: bool = True) -> Tensor:
    """Initial RoPE-Mixed frequencies, ``(2, num_heads, head_dim // 2)``.

    As the authors (and timm's ``init_random_2d_freqs``): magnitudes
    ``m_j = theta ** (-4 j / D)`` for ``j < D / 4``; head h draws an angle
    ``a_h ~ U[0, 2 pi)`` (0 when ``rotate`` is False) and its first ``D / 4``
    frequency vectors point along ``a_h``, the other ``D / 4`` along
    ``a_h + pi / 2``: ``theta^x = m cos(.)``, ``theta^y = m sin(.)``.
    Row 0 of the result holds ``theta^x``, row 1 ``theta^y``.
    """
    quarter = head_dim // 4
    mag = theta**(-torch.arange(quarter, dtype=torch.float64) * 4 / head_dim)
    if rotate:
        # drawn in float32: the same random stream as timm's initialiser
        angles = torch.rand(num_heads, 1).double() * 2 * math.pi
    else:
        angles = torch.zeros(num_heads, 1, dtype=torch.float64)
    # (num_heads, D/2): the D/4 pairs along a_h, then D/4 along a_h + pi/2
    dirs = torch.cat([angles.expand(-1, quarter),
                      (angles + math.pi / 2).expand(-1, quarter)], dim=1)
    mags = torch.cat([mag, mag])[None]
    return torch.stack([mags * dirs.cos(), mags * dirs.sin()]).float()


class RoPEMixed(nn.Module):
    """Learnable per-head 2D rotary frequencies (RoPE-Mixed).

    ``forward`` returns ``(cos, sin)`` of the angles
    ``phi_t = theta^x_t x + theta^y_t y`` (module docstring) for every token
    of an ``(h, w)`` grid, in the channel layout of
    :func:`~.rope2d.apply_rope2d` (head channels in four
    quarters ``[a, b, c, d]``, pairs ``(a_j, b_j)`` and ``(c_j, d_j)``):
    pair ``j < D / 4`` is ``(a_j, b_j)`` with frequency ``j``, pair
    ``D / 4 + j`` is ``(c_j, d_j)``. By default coordinates are integer
    token indices, ``x`` the column and ``y`` the row (timm's
    ``grid_indexing='xy'`` of its ``vit_*_rope_mixed_*`` models), starting
    at 0 on every grid: there is no reference grid, so inputs of any size
    need no resampling. ``forward(..., pos=...)`` takes other positions
    (:mod:`.rope_coords`: e.g. DINOv3's normalised patch centres, as
    ``2 pi p``, per image).

    The tables depend on the learnable :attr:`freqs`, so they are computed
    at every call (small: ``(num_heads, h * w, D)``), never cached.

    Args:
        head_dim (int): Channels per head D, a multiple of 4.
        num_heads (int): Heads; each has its own frequencies.
        theta (float): Base of the initial magnitudes. Defaults to 10
            (Heo et al. and timm for RoPE-Mixed).
        rotate (bool): Draw a random initial direction per head (the
            paper); False starts every head axis-aligned. Defaults to True.
    """

    def __init__(self,
                 head_dim: int,
                 num_heads: int,
                 theta: float = 10.,
                 rotate: bool = True) -> None:
        super().__init__()
        if not is_int(head_dim, 1) or head_dim % 4:
            raise ValueError(
                f"pos_encoding='rope-mixed' needs the head dim (embed_dims "
                f'/ num_heads) to be a positive multiple of 4, got '
                f'{head_dim!r}')
        check_int('num_heads', num_heads)
        if not theta > 0:
            raise ValueError(f'rope-mixed: `theta` must be > 0, got {theta}')
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.theta = float(theta)
        self.rotate = bool(rotate)
        #: ``(2, num_heads, head_dim // 2)``: ``theta^x`` then ``theta^y``
        self.freqs = nn.Parameter(
            init_mixed_freqs(head_dim, num_heads, theta, rotate))

    def reset_parameters(self) -> None:
        """Draw the initial frequencies again (:func:`init_mixed_freqs`),
        e.g. after a detector's Xavier init of every encoder matrix."""
        with torch.no_grad():
            self.freqs.copy_(
                init_mixed_freqs(self.head_dim, self.num_heads, self.theta,
                                 self.rotate))

    def forward(self,
                hw_shape: Tuple[int, int],
                device: Optional[torch.device] = None,
                dtype: torch.dtype = torch.float32,
                pos: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Return ``(cos, sin)`` of the ``(h, w)`` grid.

        Args:
            hw_shape (tuple[int, int]): Grid ``(h, w)``.
            device (torch.device, optional): Output device (defaults to the
                frequencies').
            dtype (torch.dtype): Output dtype (angles in at least float32).
            pos (Tensor, optional): ``(h * w, 2)`` or ``(B, h * w, 2)``
                positions ``(y, x)`` (:class:`~.rope_coords.RoPECoords`).
                None: the integer token positions.

        Returns:
            tuple[Tensor, Tensor]: Each ``(num_heads, h * w, head_dim)``, or
            ``(B, num_heads, h * w, head_dim)`` for per-image positions.
        """
        h, w = check_grid(*hw_shape)
        device = self.freqs.device if device is None else device
        # float32 at least: half-precision angles of large positions are wrong
        fdtype = torch.float64 if dtype == torch.float64 else torch.float32
        freqs = self.freqs.to(device=device, dtype=fdtype)
        if pos is None:
            pos = index_coords((h, w), device, fdtype)
        pos = pos.to(device=device, dtype=fdtype)
        # (..., 1, L, 1) * (H, 1, D/2) -> (..., H, L, D/2), row-major tokens
        xs = pos[..., None, :, 1:2]
        ys = pos[..., None, :, 0:1]
        angles = xs * freqs[0][:, None] + ys * freqs[1][:, None]
        first, second = angles.chunk(2, dim=-1)
        # pair j in quarters (a, b), pair D/4 + j in (c, d)
        angles = torch.cat([first, first, second, second], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """A checkpoint of another head count or head dim is a ValueError."""
        key = prefix + 'freqs'
        if key in state_dict and state_dict[key].shape != self.freqs.shape:
            raise ValueError(
                f'rope-mixed: checkpoint `{key}` has shape '
                f'{tuple(state_dict[key].shape)} (2, num_heads, head_dim / 2)'
                f', the model {tuple(self.freqs.shape)} (num_heads='
                f'{self.num_heads}, head_dim={self.head_dim}); build the '
                'model with the checkpoint\'s heads')
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return (f'head_dim={self.head_dim}, num_heads={self.num_heads}, '
                f'theta={self.theta}')
