"""A per-head bias of the grid offset as a relative term: the logit term of
Swin-V2's log-spaced continuous position bias, 2D ALiBi and LookHere.

Each of them adds to the attention logit of query ``i = (iy, ix)`` and key
``j = (jy, jx)`` of an ``(h, w)`` token grid a value of head ``n`` that
depends only on the offset:

.. math::

    T^n_{ij} = B^n[iy - jy + h - 1, \\; ix - jx + w - 1]

with a table ``B`` of ``(2 h - 1) (2 w - 1)`` entries per head, made for
each call's grid by the module that owns the encoding
(:class:`OffsetBias` subclasses: :mod:`.log_cpb`, :mod:`.alibi_2d`,
:mod:`.lookhere`). As iRPE's product method does, the pair's bucket is
``u * (2 w - 1) + v`` with the per-axis buckets ``u = iy - jy + h - 1``
(``2 h - 1`` of them) and ``v = ix - jx + w - 1`` (``2 w - 1``), so the
term is :class:`~mmpe.models.layers.terms.relative_term.AxisValues` of the
``'product'`` layout with values ``(1, H, 1, (2h-1)(2w-1))`` broadcast over
the batch and the queries: the fused kernels (C++ on CPU, Triton on CUDA)
run it unchanged, and the explicit, chunked and SDPA backends through
:meth:`OffsetBiasTerm.add_rows` / :meth:`OffsetBiasTerm.dense`.

Skip (class) tokens: a pair with one of the ``skip`` leading tokens gets
0, in both directions. LookHere's released code pads its bias map with a
zero row and column for its class token; timm's ``RelPosMlp``
(``prefix_tokens``) pads the log-CPB bias with zeros alike; Swin-V2 and
CROMA have no class token. The extra bucket of those pairs holds the 0.

The tables are small (``H (2h-1)(2w-1)``); the ``(L, L)`` term is built
with two gathers of small per-axis indices (no ``(L, L)`` index), and its
adjoint on a block of rows is a bucket sum of that block.
"""
import json
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from mmengine.model import BaseModule
from torch import Tensor

from ....utils.arg_checks import check_int
from ..common.arg_checks import check_grid
from ..terms.registry import register_term
from ..terms.relative_term import AxisValues, RelativeTerm, Rows


def axis_buckets(size: int, device: torch.device) -> Tensor:
    """(size, size) long: ``a - b + size - 1`` for query ``a`` and key ``b``
    of one axis (the per-axis bucket, in ``[0, 2 size - 1)``)."""
    idx = torch.arange(size, device=device)
    return idx[:, None] - idx[None, :] + (size - 1)


def grid_offsets(height: int, width: int, device: torch.device,
                 dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """The offsets of the table's entries: ``dy`` and ``dx``, each
    ``(2 h - 1, 2 w - 1)``, with ``dy[u, v] = u - (h - 1)`` (query row
    minus key row, ``iy - jy``) and ``dx[u, v] = v - (w - 1)``."""
    dy = torch.arange(2 * height - 1, device=device, dtype=dtype) - (height
                                                                     - 1)
    dx = torch.arange(2 * width - 1, device=device, dtype=dtype) - (width
                                                                    - 1)
    return (dy[:, None].expand(-1, dx.shape[0]),
            dx[None, :].expand(dy.shape[0], -1))


def pair_buckets(height: int, width: int, start: int, stop: int,
                 device: torch.device) -> Tensor:
    """(stop - start, h * w) long: the bucket ``u * (2 w - 1) + v`` of
    every pair of the grid queries ``[start, stop)`` and all keys."""
    qy, qx = torch.arange(start, stop, device=device).div(
        width, rounding_mode='floor'), torch.arange(
            start, stop, device=device) % width
    keys = torch.arange(height * width, device=device)
    ky, kx = keys.div(width, rounding_mode='floor'), keys % width
    u = qy[:, None] - ky[None, :] + (height - 1)
    v = qx[:, None] - kx[None, :] + (width - 1)
    return u * (2 * width - 1) + v


@register_term
class OffsetBiasTerm(RelativeTerm):
    """``T[i, j] = B[:, b(i, j)]`` of one attention call (module docstring):
    one table entry per head and offset bucket, 0 at skip tokens.

    Args (those of :class:`RelativeTerm`):
        spec (dict): ``{}`` (the grid and ``length`` give the rest).
        tensors (list[Tensor]): The table ``B`` (H, (2h-1)(2w-1)), row-major
            over ``(u, v)``, in the attention's dtype.
        height (int): Grid height.
        width (int): Grid width.
        length (int): Tokens ``skip + height * width``.
    """

    kind = 'offset-bias'

    @property
    def skip(self) -> int:
        """Leading tokens outside the grid."""
        return self.length - self.height * self.width

    def _bias(self, start: int = 0, stop: Optional[int] = None) -> Tensor:
        """(H, R, h * w): the term of the grid queries ``[start, stop)``
        (None: to the end). Two gathers: the rows' buckets ``u``, then the
        columns' ``v``, for the grid rows that hold the queries."""
        h, w = self.height, self.width
        table = self.tensors[0]
        heads = table.shape[0]
        rows = axis_buckets(h, table.device)
        first = 0
        if stop is not None:  # a block of rows: Python ints (eager)
            first, last = start // w, (stop - 1) // w + 1
            rows = rows[first:last]
        cols = axis_buckets(w, table.device)
        # (H, 2h-1, 2w-1)[:, rows] -> (H, n, h, 2w-1) [iy, jy, v]
        by_rows = table.reshape(heads, 2 * h - 1, 2 * w - 1)[:, rows]
        # [..., cols] -> (H, n, h, w, w) [iy, jy, ix, jx]
        pairs = by_rows[..., cols].permute(0, 1, 3, 2, 4)
        bias = pairs.reshape(heads, -1, h * w)
        if stop is None:
            return bias
        return bias[:, start - first * w:stop - first * w]

    def dense(self) -> Tuple[Tensor, bool]:
        """(1, H, L, L), zero rows and columns at the skip tokens."""
        skip = self.skip
        bias = self._bias()[None]
        if skip:
            bias = F.pad(bias, (skip, 0, skip, 0))
        return bias, True

    def add_rows(self, logits: Tensor, rows: Rows) -> Tensor:
        skip = self.skip
        if rows is None:
            target = logits[:, :, skip:, skip:] if skip else logits
            target.add_(self._bias())
            return logits
        start, stop = max(rows[0], skip), rows[1]
        if stop > start:
            logits[:, :, start - rows[0]:, skip:].add_(
                self._bias(start - skip, stop - skip))
        return logits

    def backward_rows(self, grad: Tensor, rows: Tuple[int, int],
                      grads: List[Tensor], probs: Optional[Tensor] = None,
                      grad_out: Optional[Tensor] = None) -> None:
        skip = self.skip
        start, stop = max(rows[0], skip), rows[1]
        if stop <= start:
            return
        # the bucket sums of dL/dT over the block's pairs and the batch
        block = grad[:, :, start - rows[0]:, skip:].sum(0)  # (H, R', L0)
        ids = pair_buckets(self.height, self.width, start - skip,
                           stop - skip, grad.device)
        grads[0].index_add_(1, ids.reshape(-1),
                            block.reshape(block.shape[0], -1).to(
                                grads[0].dtype))

    @property
    def axis_layout(self) -> Optional[str]:
        """``'product'``: the bucket of a pair is ``u * (2 w - 1) + v``."""
        return 'product'

    @property
    def axis_shared(self) -> bool:
        """The table is shared by every query and image."""
        return True

    def axis_values(self) -> AxisValues:
        """The table as values ``(1, H, 1, nb)`` shared by every query
        (``nb = (2h-1)(2w-1)``, plus the zero bucket of skip-token pairs
        where there are skip tokens)."""
        h, w, skip = self.height, self.width, self.skip
        table = self.tensors[0]
        extras = ()
        if skip:
            extras = (table.shape[1], )
            table = F.pad(table, (0, 1))
        device = table.device
        return AxisValues(table[None, :, None, :], axis_buckets(h, device),
                          axis_buckets(w, device), 'product', 2 * h - 1,
                          2 * w - 1, None, skip, extras, 'k')


class OffsetBias(BaseModule):
    """A module that owns a per-head offset bias and builds its term.

    Subclasses implement :meth:`table` (the ``(H, (2h-1)(2w-1))`` table of
    a grid, module docstring); :meth:`term` is the relative term of one
    attention call, :meth:`forward` the whole ``(H, L, L)`` bias.

    Args:
        num_heads (int): Heads of the attention (one table row each).
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self, num_heads: int,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        check_int('num_heads', num_heads)
        self.num_heads = num_heads
        self._spec_json = json.dumps({})

    def table(self, height: int, width: int, device: torch.device,
              dtype: torch.dtype) -> Tensor:
        """(H, (2h-1)(2w-1)): entry ``u * (2 w - 1) + v`` is the bias of the
        offset ``(iy - jy, ix - jx) = (u - h + 1, v - w + 1)``."""
        raise NotImplementedError

    def term(self, qs: Tensor, height: int, width: int) -> OffsetBiasTerm:
        """The relative term of one call whose queries ``qs`` (B, H, L, d)
        give the device, the dtype and ``L`` (skip tokens first)."""
        table = self.table(height, width, qs.device, qs.dtype)
        return OffsetBiasTerm({}, [table], height, width, qs.shape[2],
                              self._spec_json)

    def forward(self,
                height: int,
                width: int,
                dtype: Optional[torch.dtype] = None) -> Tensor:
        """The whole bias ``(H, h * w, h * w)`` of a grid (for inspection
        and tests), in ``dtype`` (None: the parameters', else the default)
        on the parameters' device."""
        height, width = check_grid(height, width)
        param = next(iter(self.parameters()), None)
        device = torch.device('cpu') if param is None else param.device
        if dtype is None:
            dtype = torch.get_default_dtype() if param is None else \
                param.dtype
        table = self.table(height, width, device, dtype)
        term = OffsetBiasTerm({}, [table], height, width, height * width,
                              self._spec_json)
        return term.dense()[0][0]
