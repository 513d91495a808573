"""Swin-V2's log-spaced continuous position bias (log-CPB).

Liu et al., "Swin Transformer V2: Scaling Up Capacity and Resolution"
(CVPR 2022, Sec. 3.3, Eq. 3-4): the bias of the offset
``(dy, dx) = (iy - jy, ix - jx)`` is a small MLP ``G`` of log-spaced
coordinates,

.. math::

    \\hat d = \\mathrm{sign}(d) \\frac{\\log_2(1 + |8 d / (S_0 - 1)|)}
                                      {\\log_2 8}, \\qquad
    B^n(dy, dx) = 16 \\, \\sigma(G(\\hat{dy}, \\hat{dx}))_n

for each head ``n``, where ``S_0`` is the pre-training window along the
axis (``pretrained_window_size``: the offsets of the pre-training window
span ``[-8, 8]`` before the log). As in the authors' ``WindowAttention``
(microsoft/Swin-Transformer ``models/swin_transformer_v2.py``): ``G`` is
``Linear(2, 512) -> ReLU -> Linear(512, H, bias=False)`` named
``cpb_mlp`` (the checkpoints' keys), the input is ``(dy, dx)`` in that
order, and the ``16 sigmoid`` follows the gather. Because the table is the
MLP of the offsets of each call's grid ``(2h-1)(2w-1)`` inputs, once per
call), a grid larger than the pre-training one gets new, log-compressed
offsets: nothing is interpolated.

The bias is added to mmpe's scaled dot-product logits
(:class:`~mmpe.models.layers.PEAttention`); Swin-V2's cosine attention
and its learnable logit scale are not part of the encoding.
"""
import math
from typing import Optional, Sequence, Tuple, Union

import torch
from mmdet.registry import MODELS
from torch import Tensor, nn

from ....utils.arg_checks import check_int, is_int
from .offset_term import OffsetBias, grid_offsets


def log_spaced(offsets: Tensor, window: int) -> Tensor:
    """``sign(d) log2(1 + |8 d / (window - 1)|) / log2(8)`` (Swin-V2)."""
    scaled = offsets * (8.0 / (window - 1))
    return torch.sign(scaled) * torch.log2(scaled.abs() + 1.0) / math.log2(8)


def parse_window(value: Union[int, Sequence[int]],
                 field: str = 'pretrained_size') -> Tuple[int, int]:
    """A pre-training window ``(h0, w0)`` of ints >= 2 (an int: square)."""
    pair = (value, value) if is_int(value) else value
    if (not isinstance(pair, (list, tuple)) or len(pair) != 2
            or not all(is_int(s, 2) for s in pair)):
        raise ValueError(
            f'Unsupported `{field}` {value!r}, please choose an int >= 2 or '
            'a pair of them (the pre-training grid that normalises the '
            'offsets, Swin-V2\'s pretrained_window_size)')
    return tuple(pair)


@MODELS.register_module()
class LogCPB(OffsetBias):
    """Swin-V2's log-spaced continuous position bias of one attention.

    Args:
        num_heads (int): Heads of the attention (the MLP's outputs).
        pretrained_size (int | tuple[int, int]): The pre-training window
            ``(h0, w0)`` (ints >= 2) that normalises the offsets: Swin-V2's
            ``pretrained_window_size``; a window block's ``(S, S)``, or the
            training grid of a global attention.
        hidden (int): Hidden channels of the MLP. Defaults to 512 (Swin-V2).
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self,
                 num_heads: int,
                 pretrained_size: Union[int, Sequence[int]],
                 hidden: int = 512,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(num_heads, init_cfg=init_cfg)
        check_int('hidden', hidden)
        self.pretrained_size = parse_window(pretrained_size)
        self.hidden = hidden
        self.cpb_mlp = nn.Sequential(
            nn.Linear(2, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, num_heads, bias=False))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Swin-V2's initialisation of its linear layers (its
        ``_init_weights``): truncated normal weights (std 0.02), zero
        biases; the bias then starts near ``16 sigmoid(0) = 8`` everywhere,
        i.e. no preference."""
        for layer in self.cpb_mlp:
            if isinstance(layer, nn.Linear):
                nn.init.trunc_normal_(layer.weight, std=0.02)
                if layer.bias is not None:
                    layer.bias.zero_()

    def init_weights(self) -> None:
        """:meth:`reset_parameters`, then any ``init_cfg``."""
        self.reset_parameters()
        super().init_weights()

    def coords(self, height: int, width: int, device: torch.device,
               dtype: torch.dtype) -> Tensor:
        """(2h-1, 2w-1, 2): the MLP's inputs, log-spaced ``(dy, dx)``."""
        dy, dx = grid_offsets(height, width, device, dtype)
        h0, w0 = self.pretrained_size
        return torch.stack([log_spaced(dy, h0), log_spaced(dx, w0)], -1)

    def table(self, height: int, width: int, device: torch.device,
              dtype: torch.dtype) -> Tensor:
        weight = self.cpb_mlp[0].weight
        coords = self.coords(height, width, weight.device, weight.dtype)
        # one MLP evaluation per offset of the grid: (2h-1, 2w-1, H)
        bias = 16 * torch.sigmoid(self.cpb_mlp(coords))
        return bias.reshape(-1, self.num_heads).t().contiguous().to(
            device=device, dtype=dtype)

    def extra_repr(self) -> str:
        return (f'num_heads={self.num_heads}, '
                f'pretrained_size={self.pretrained_size}, '
                f'hidden={self.hidden}')
