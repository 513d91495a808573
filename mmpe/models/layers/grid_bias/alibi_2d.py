"""2D ALiBi: a fixed per-head slope times the Euclidean distance of patches.

ALiBi (Press et al., "Train Short, Test Long", ICLR 2022) penalises the
logit of a pair by a head's slope times its distance; CROMA (Fuller et al.,
"CROMA: Remote Sensing Representations with Contrastive Radar-Optical
Masked Autoencoders", NeurIPS 2023, Sec. 3, ``get_2dalibi`` of the released
``use_croma.py``) takes the Euclidean distance between patches of the grid:

.. math::

    B^n(dy, dx) = -m_n \\sqrt{dy^2 + dx^2}

with ALiBi's geometric slopes ``m_n``: for ``H`` a power of two
``m_n = 2^{-8 (n + 1) / H}``, ``n = 0 .. H - 1``; otherwise the slopes of
the power of two ``c`` below ``H`` followed by every other slope of
``2 c`` (``2^{-4 (2 k + 1) / c}``, ``k = 0 .. H - c - 1``). No parameters;
the table follows each call's grid, so any size is exact.
"""
import math
from typing import List, Optional

import torch
from mmdet.registry import MODELS
from torch import Tensor

from .offset_term import OffsetBias, grid_offsets


def alibi_slopes(num_heads: int) -> List[float]:
    """ALiBi's per-head slopes (module docstring), as CROMA uses them."""
    def power_of_two(n: int) -> List[float]:
        return [2.0**(-8.0 * (i + 1) / n) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return power_of_two(num_heads)
    below = 2**int(math.floor(math.log2(num_heads)))
    return power_of_two(below) + power_of_two(
        2 * below)[0::2][:num_heads - below]


@MODELS.register_module()
class ALiBi2D(OffsetBias):
    """CROMA's 2D ALiBi of one attention (no parameters).

    Args:
        num_heads (int): Heads of the attention (one slope each).
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self,
                 num_heads: int,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(num_heads, init_cfg=init_cfg)
        # Python floats: exact in any dtype the table is made in
        self.slopes = alibi_slopes(num_heads)

    def table(self, height: int, width: int, device: torch.device,
              dtype: torch.dtype) -> Tensor:
        work = torch.promote_types(dtype, torch.float32)
        dy, dx = grid_offsets(height, width, device, work)
        dist = torch.sqrt(dy * dy + dx * dx).reshape(1, -1)
        slopes = torch.tensor(self.slopes, device=device, dtype=work)[:, None]
        return (-slopes * dist).to(dtype)

    def extra_repr(self) -> str:
        return f'num_heads={self.num_heads}'
