"""Box-to-pixel relative position bias (BoxRPB) of a DETR decoder's
cross-attention, as a relative term of the attention core.

Lin et al., "DETR Doesn't Need Multi-Scale or Locality Design" (Plain-DETR,
ICCV 2023, Sec. 3.2, Eq. 2-4): for a query whose reference box is
``(x1, y1, x2, y2)`` (pixels) and a key at the pixel centre
``(px, py) = ((jx + 1/2) s, (jy + 1/2) s)`` of the feature grid of stride
``s``, the cross-attention logit of head ``h`` gets

.. math::

    B_h[q, (jy, jx)] = \\mathrm{MLP}^x(\\phi(x_1 - p_x, x_2 - p_x))_h
                     + \\mathrm{MLP}^y(\\phi(y_1 - p_y, y_2 - p_y))_h

with two small MLPs (``in -> hidden -> heads``, ReLU, no output bias) and
``phi`` the identity (``offsets='linear'``) or
``sign(d) log2(|d| + 1) / log2(8)`` (``'log8'``). The decomposition costs
``Q (h + w)`` MLP evaluations instead of ``Q h w``. The point variant
(``mode='point'``, reference points ``(x, y)`` as Conditional DETR's) feeds
one offset per axis, ``x - px`` and ``y - py``, to MLPs of input 1.

Reference boxes / points are normalised to each image's valid extent (as
mmdet's DETR heads predict them); they are turned into pixels with the
extent of the image's valid feature cells times ``s`` (the valid ratios of
the released code), so an image gets the same bias alone or in a padded
batch.

The bias is the relative term :class:`AxisBiasTerm`: per-axis values
``(B, H, Q, h)`` and ``(B, H, Q, w)`` broadcast-added to the logits of the
rows at hand, so every backend of
:class:`~mmpe.models.layers.PEAttention` (explicit, chunked, SDPA mask)
runs it, and the chunked one keeps no ``(B, H, Q, h w)`` tensor for the
backward.
"""
import json
from typing import List, Optional, Tuple

import torch
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor, nn

from ....utils.arg_checks import check_int
from ..common.arg_checks import check_choice
from ..terms.registry import register_term
from ..terms.relative_term import AxisValues, RelativeTerm, Rows

#: reference kinds: ``'box'`` (x1, y1, x2, y2), ``'point'`` (x, y)
RPB_MODES = ('box', 'point')
#: how an offset in pixels enters the MLPs
RPB_OFFSETS = ('linear', 'log8')


@register_term
class AxisBiasTerm(RelativeTerm):
    """A logit term that is a sum of per-axis values of each query:
    ``T[q, (jy, jx)] = by[q, jy] + bx[q, jx]`` over an ``(h, w)`` key grid
    (the queries need not be a grid: cross-attention).

    Args (those of :class:`RelativeTerm`):
        spec (dict): ``{}``.
        tensors (list[Tensor]): ``by`` (B, H, Q, h) and ``bx`` (B, H, Q, w).
        height (int): Key grid height.
        width (int): Key grid width.
        length (int): Queries ``Q`` (not read).
    """

    kind = 'axis-bias'

    @property
    def axis_layout(self) -> Optional[str]:
        """``'cross'``: the buckets of a key are its row and its column."""
        return 'cross'

    @property
    def axis_query_grid(self) -> bool:
        """The queries are not grid tokens."""
        return False

    def axis_values(self) -> AxisValues:
        """``[by, bx]`` per query over ``h + w`` buckets; the key ``(jy,
        jx)`` reads buckets ``jy`` and ``h + jx`` (identity tables seen
        from the grid's origin, ``query_grid=False``)."""
        by, bx = self.tensors
        rows = torch.arange(self.height, device=by.device)[None]
        cols = torch.arange(self.width, device=by.device)[None]
        return AxisValues(torch.cat([by, bx], -1), rows, cols, 'cross',
                          self.height, self.width, self.height, on='k',
                          query_grid=False)

    def _rows(self, rows: Rows) -> Tuple[Tensor, Tensor]:
        by, bx = self.tensors
        if rows is not None:
            by, bx = by[:, :, rows[0]:rows[1]], bx[:, :, rows[0]:rows[1]]
        return by, bx

    def dense(self) -> Tuple[Tensor, bool]:
        by, bx = self._rows(None)
        b, h, q, _ = by.shape
        # (B, H, Q, h, 1) + (B, H, Q, 1, w) -> (B, H, Q, h * w)
        return (by[..., :, None] + bx[..., None, :]).reshape(
            b, h, q, self.height * self.width), True

    def add_rows(self, logits: Tensor, rows: Rows) -> Tensor:
        by, bx = self._rows(rows)
        b, h, r, _ = logits.shape
        # (B, H, R, h * w) viewed as (B, H, R, h, w): one broadcast add
        logits.view(b, h, r, self.height, self.width).add_(
            by[..., :, None] + bx[..., None, :])
        return logits

    def backward_rows(self, grad: Tensor, rows: Tuple[int, int],
                      grads: List[Tensor], probs: Optional[Tensor] = None,
                      grad_out: Optional[Tensor] = None) -> None:
        b, h, r, _ = grad.shape
        g = grad.view(b, h, r, self.height, self.width)
        grads[0][:, :, rows[0]:rows[1]] += g.sum(-1)
        grads[1][:, :, rows[0]:rows[1]] += g.sum(-2)


def valid_extent(key_padding_mask: Optional[Tensor], height: int,
                 width: int, like: Tensor) -> Tensor:
    """Each image's valid feature cells ``(h_i, w_i)`` of a padded batch.

    mmdet pads bottom / right, so the first column (row) of the grid holds
    an image's valid rows (columns).

    Args:
        key_padding_mask (Tensor, optional): (B, h * w) bool, True at
            padding; None: nothing padded.
        height (int): Grid height.
        width (int): Grid width.
        like (Tensor): Gives the float dtype and device.

    Returns:
        Tensor: (B, 2) or, without a mask, (1, 2): ``(h_i, w_i)``.
    """
    if key_padding_mask is None:  # one unpadded image for all
        key_padding_mask = torch.zeros(
            1, height * width, dtype=torch.bool, device=like.device)
    valid = ~key_padding_mask.bool().view(-1, height, width)
    return torch.stack([valid[:, :, 0].sum(1), valid[:, 0, :].sum(1)],
                       -1).to(like.dtype)


def axis_offsets(coords: Tensor, extent: Tensor, size: int,
                 stride: float) -> Tensor:
    """Offsets in pixels from normalised reference coordinates to the key
    pixel centres of one axis: ``c * extent * s - (j + 1/2) s``.

    Args:
        coords (Tensor): (B, Q, k) coordinates in ``[0, 1]`` of the valid
            extent (k = 2 box edges or 1 point coordinate).
        extent (Tensor): (B,) or (1,) valid cells along the axis.
        size (int): Grid cells along the axis.
        stride (float): Pixels per cell.

    Returns:
        Tensor: (B, Q, size, k).
    """
    centres = (torch.arange(size, dtype=coords.dtype, device=coords.device)
               + 0.5) * stride  # (size, )
    pixels = coords * (extent * stride)[:, None, None]  # (B, Q, k)
    return pixels[:, :, None, :] - centres[None, None, :, None]


def log8(offsets: Tensor) -> Tensor:
    """``sign(d) log2(|d| + 1) / log2(8)`` (Plain-DETR's ``abs_log8``)."""
    return torch.sign(offsets) * torch.log2(offsets.abs() + 1.0) / 3.0


@MODELS.register_module()
class BoxRPB(BaseModule):
    """The two per-axis MLPs of BoxRPB and the term of one decoder layer.

    Args:
        num_heads (int): Heads of the cross-attention (the MLPs' outputs).
        mode (str): ``'box'`` (reference boxes ``(cx, cy, w, h)``, offsets
            to both edges, MLP input 2) or ``'point'`` (reference points
            ``(x, y)``, MLP input 1). Defaults to 'box'.
        hidden (int): Hidden channels of each MLP (Plain-DETR: 512).
            Defaults to 512.
        offsets (str): ``'linear'`` (pixels) or ``'log8'``. Defaults to
            'linear'.
        stride (float): Pixels per feature cell (32 for a ResNet C5 map).
            Defaults to 32.
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self,
                 num_heads: int,
                 mode: str = 'box',
                 hidden: int = 512,
                 offsets: str = 'linear',
                 stride: float = 32,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        check_int('num_heads', num_heads)
        check_choice('mode', mode, RPB_MODES)
        check_int('hidden', hidden)
        check_choice('offsets', offsets, RPB_OFFSETS)
        if isinstance(stride, bool) or not isinstance(
                stride, (int, float)) or not stride > 0:
            raise ValueError(
                f'Unsupported `stride` {stride!r}, please choose a number > 0 '
                '(pixels per feature cell)')
        self.num_heads, self.mode, self.offsets = num_heads, mode, offsets
        self.hidden, self.stride = hidden, float(stride)
        in_dims = 2 if mode == 'box' else 1
        self.mlp_x = self._mlp(in_dims, hidden, num_heads)
        self.mlp_y = self._mlp(in_dims, hidden, num_heads)
        self._spec_json = json.dumps({})

    @staticmethod
    def _mlp(in_dims: int, hidden: int, out_dims: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Linear(in_dims, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, out_dims, bias=False))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Truncated normal weights (std 0.02) and zero biases, the
        initialisation of Plain-DETR's decoder."""
        for mlp in (self.mlp_x, self.mlp_y):
            for layer in mlp:
                if isinstance(layer, nn.Linear):
                    nn.init.trunc_normal_(layer.weight, std=0.02)
                    if layer.bias is not None:
                        layer.bias.zero_()

    def axis_bias(self, refs: Tensor, extent: Tensor, height: int,
                  width: int) -> Tuple[Tensor, Tensor]:
        """The per-axis biases of every query.

        Args:
            refs (Tensor): (B, Q, 4) boxes ``(cx, cy, w, h)`` or (B, Q, >= 2)
                points ``(x, y, ...)``, normalised to the valid extent.
            extent (Tensor): (B, 2) or (1, 2) valid cells ``(h_i, w_i)``
                (:func:`valid_extent`).
            height (int): Key grid height.
            width (int): Key grid width.

        Returns:
            tuple[Tensor, Tensor]: ``by`` (B, H, Q, h) and ``bx``
            (B, H, Q, w).
        """
        if self.mode == 'box':
            if refs.shape[-1] != 4:
                raise ValueError(
                    f"BoxRPB mode='box' needs reference boxes (B, Q, 4), got "
                    f"{tuple(refs.shape)}; choose mode='point' for points")
            centre, size = refs[..., :2], refs[..., 2:]
            # (B, Q, 2): (x1, x2) and (y1, y2)
            xs = torch.stack([centre[..., 0] - size[..., 0] / 2,
                              centre[..., 0] + size[..., 0] / 2], -1)
            ys = torch.stack([centre[..., 1] - size[..., 1] / 2,
                              centre[..., 1] + size[..., 1] / 2], -1)
        else:
            xs, ys = refs[..., 0:1], refs[..., 1:2]
        dx = axis_offsets(xs, extent[:, 1], width, self.stride)
        dy = axis_offsets(ys, extent[:, 0], height, self.stride)
        if self.offsets == 'log8':
            dx, dy = log8(dx), log8(dy)
        # (B, Q, size, H) -> (B, H, Q, size)
        bx = self.mlp_x(dx).permute(0, 3, 1, 2)
        by = self.mlp_y(dy).permute(0, 3, 1, 2)
        return by, bx

    def term(self, refs: Tensor, key_padding_mask: Optional[Tensor],
             height: int, width: int) -> AxisBiasTerm:
        """The relative term of one cross-attention call.

        Args:
            refs (Tensor): Reference boxes / points, see :meth:`axis_bias`.
            key_padding_mask (Tensor, optional): (B, h * w) bool, True at
                padded keys.
            height (int): Key grid height.
            width (int): Key grid width.

        Returns:
            AxisBiasTerm: Tensors ``by`` and ``bx``.
        """
        extent = valid_extent(key_padding_mask, height, width, refs)
        by, bx = self.axis_bias(refs, extent, height, width)
        return AxisBiasTerm({}, [by, bx], height, width, refs.shape[1],
                            self._spec_json)

    def forward(self, refs: Tensor, key_padding_mask: Optional[Tensor],
                height: int, width: int) -> Tensor:
        """The whole bias ``(B, H, Q, h * w)`` (for inspection and tests)."""
        return self.term(refs, key_padding_mask, height, width).dense()[0]

    def extra_repr(self) -> str:
        return (f'num_heads={self.num_heads}, mode={self.mode!r}, '
                f'hidden={self.hidden}, offsets={self.offsets!r}, '
                f'stride={self.stride}')
