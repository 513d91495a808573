"""Expansion plans of iRPE: per-bucket values <-> (L0, L0) attention terms.

The efficient computation of Eq. 26-28 of `Rethinking and Improving Relative
Position Encoding for Vision Transformer <https://arxiv.org/abs/2107.14222>`_
(Wu et al., ICCV 2021), improved so that neither an ``(L, L, head_dim)``
tensor nor (for the product method) an ``(L, L)`` gather index is needed.
A plan is built from the per-axis tables of
:func:`~mmpe.models.layers.irpe.buckets.axis_bucket_tables`, once per
(method, index, grid, device)
(:func:`~mmpe.models.layers.irpe.plan_cache.get_plan`); the autograd
functions of :mod:`~mmpe.models.layers.irpe.plan_ops` make ``expand`` and
``reduce`` differentiable.
"""
import copy
from typing import Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common.tracing import is_tracing
from .buckets import spatial_bucket_ids

# ---------------------------------------------------------------------------
# Spatial plans: (N, L0, nbs) per-query bucket values <-> (N, L0, L0) terms.
#
# ``expand`` maps P to T with T[n, i, j] = P[n, i, bucket(i, j)] (Eq. 27-28)
# and ``reduce`` is its adjoint, R[n, i, b] = sum_{j: bucket(i, j) = b}
# A[n, i, j] (the bucket-summed attention of iRPE on values, Eq. 17). Each is
# the other's backward. Only spatial tokens (L0 = height * width) and
# spatial buckets (nbs, without the skip bucket) are handled here.
# ---------------------------------------------------------------------------


class _BlockPlans:
    """What every spatial plan shares: the grid, its per-axis tables, and
    :meth:`block`, the plan of a block of (query, key) pairs.

    A block restricted to a range of queries (the *viewers*, whose
    per-bucket values are expanded) keeps the plan's own structured
    expansion, sliced per query; a block restricted to a range of keys (the
    iRPE term on queries of one chunk of query rows, read transposed) is a
    :class:`GatherPlan` over bucket ids built for that block from the
    per-axis tables
    (:func:`~mmpe.models.layers.irpe.buckets.spatial_bucket_ids`),
    so no (L0, L0) id map is made.
    """

    def _init_grid(self, tables: Dict[str, Tensor], height: int, width: int,
                   method: str, side: int) -> None:
        self.tables, self.method, self.side = tables, method, side
        self.height, self.width = height, width
        #: (start, stop) of the query rows of a row block; None: all rows
        self.viewers: Optional[Tuple[int, int]] = None

    @property
    def num_spatial_buckets(self) -> int:
        """Columns of the per-query values (``nbs``)."""
        return {'product': self.side * self.side,
                'cross': 2 * self.side}.get(self.method, self.side)

    @property
    def num_viewers(self) -> int:
        """Query rows the plan expands (``L0`` for the whole map)."""
        if self.viewers is None:
            return self.height * self.width
        return self.viewers[1] - self.viewers[0]

    def block(self,
              rows: Optional[Tuple[int, int]] = None,
              cols: Optional[Tuple[int, int]] = None) -> 'Plan':
        """The plan of queries ``[r0, r1)`` x keys ``[c0, c1)`` (spatial
        indices; None: all), expanding ``(N, R, nbs)`` to ``(N, R, C)``.
        """
        if rows is None and cols is None:
            return self
        if cols is None:
            return self._rows(*rows)
        ids = spatial_bucket_ids(self.tables, self.height, self.width,
                                 self.method, self.side, rows, cols,
                                 col_offset=self.side)
        return GatherPlan(ids, self.num_spatial_buckets)

    def _rows(self, start: int, stop: int) -> 'Plan':
        ids = spatial_bucket_ids(self.tables, self.height, self.width,
                                 self.method, self.side, (start, stop),
                                 col_offset=self.side)
        return GatherPlan(ids, self.num_spatial_buckets)


class ProductPlan(_BlockPlans):
    """Product method: bucket(i, j) = ry(iy, jy) * S + rx(ix, jx).

    The bucket factorises into a row part and a column part. With ``P_i``
    the values of query ``i = (iy, ix)`` viewed as an ``S x S`` matrix (rows:
    the row bucket, columns: the column bucket), the (height, width) block of
    its keys is ``T_i = OY[iy] @ P_i @ OX[ix]^T`` where ``OY[iy]`` (height, S)
    and ``OX[ix]`` (width, S) are one-hot matrices of the per-axis ids, and
    the adjoint is ``R_i = OY[iy]^T @ A_i @ OX[ix]``.

    * expand: two gathers with small per-axis indices, ``(L0, height)`` and
      ``(L0, width)`` broadcast over the batch (selection is exact, and a
      gather is the cheapest way to write the (L0, L0) output); no (L0, L0)
      index is built or cached.
    * reduce (the backward of iRPE on q / k, the forward of iRPE on v):
      batched one-hot matmuls, contracting the key rows first, so that no
      scatter is needed (scatter-add took 1.8x the matmuls' time on CPU at
      25 x 42, B=2, H=8, and is atomics on CUDA), one batch item at a time
      with the per-query operands ``OY[iy]^T`` and ``OX[ix]`` shared by the
      items.

    Every step is per query, so a block of query rows (:meth:`block`) is
    the same plan with its per-query indices and operands sliced.
    """

    def __init__(self, rows: Tensor, cols: Tensor, side: int) -> None:
        h, w = rows.shape[0], cols.shape[0]
        self._init_grid(dict(rows=rows, cols=cols), h, w, 'product', side)
        self.rows, self.cols = rows, cols  # (h, h), (w, w) long in [0, S)
        # per query i = (iy, ix): row bucket of each key row jy, (1, L0, h, 1),
        # and column bucket of each key column jx, (1, L0, 1, w)
        l0 = h * w
        self.row_index = rows[:, None].expand(h, w, h).reshape(1, l0, h, 1)
        self.col_index = cols[None].expand(h, w, w).reshape(1, l0, 1, w)
        self._onehots: Dict[torch.dtype, Tuple[Tensor, Tensor]] = {}

    def _rows(self, start: int, stop: int) -> 'ProductPlan':
        plan = copy.copy(self)  # shares the tables and one-hot cache
        plan.viewers = (start, stop)
        plan.row_index = self.row_index[:, start:stop]
        plan.col_index = self.col_index[:, start:stop]
        return plan

    def onehots(self, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """One-hot matrices ``OY`` (h, h, S) and ``OX`` (w, w, S).

        ``OY[iy, jy, u] = [ry(iy, jy) == u]`` and likewise for ``OX``.
        """
        if is_tracing():  # no state changes inside a traced function
            return (F.one_hot(self.rows, self.side).to(dtype),
                    F.one_hot(self.cols, self.side).to(dtype))
        if dtype not in self._onehots:
            self._onehots[dtype] = (F.one_hot(self.rows, self.side).to(dtype),
                                    F.one_hot(self.cols, self.side).to(dtype))
        return self._onehots[dtype]

    @staticmethod
    def _per_query(op: Tensor, outer: bool, times: int, items: int) -> Tensor:
        """Repeat a per-axis operand into a per-query batch.

        Args:
            op (Tensor): (A, r, c), indexed by one axis of a two-axis query
                batch.
            outer (bool): Whether that axis is the outer one (then the inner
                axis, of size ``times``, repeats it) or the inner one.
            times (int): Size of the other axis.
            items (int): Repetitions of the whole batch (batch items).

        Returns:
            Tensor: (items * A * times, r, c).
        """
        a, r, c = op.shape
        op = op[:, None] if outer else op[None]
        op = op.expand((a, times, r, c) if outer else (times, a, r, c))
        op = op.reshape(-1, r, c)
        return op if items == 1 else op.repeat(items, 1, 1)

    def _query_operand(self, op: Tensor, outer: bool, items: int) -> Tensor:
        """:meth:`_per_query` for the plan's queries: ``op[iy]`` (``outer``)
        or ``op[ix]`` of every query, ``(items * num_viewers, r, c)``."""
        if self.viewers is None:
            other = self.width if outer else self.height
            return self._per_query(op, outer, other, items)
        query = torch.arange(*self.viewers, device=op.device)
        axis = query // self.width if outer else query % self.width
        op = op.index_select(0, axis)
        return op if items == 1 else op.repeat(items, 1, 1)

    def expand(self, p: Tensor) -> Tensor:
        """(N, R, S * S) -> (N, R, L0) contiguous, see the class docstring.
        """
        h, w, s = self.height, self.width, self.side
        n, nv = p.shape[0], self.num_viewers
        row_index = self.row_index.expand(n, nv, h, s)
        col_index = self.col_index.expand(n, nv, h, w)
        # (n, i, u, v) -> (n, i, jy, v): the row bucket of every key row
        rows = p.reshape(n, nv, s, s).gather(2, row_index)
        # (n, i, jy, v) -> (n, i, jy, jx): the column bucket of every key
        return rows.gather(3, col_index).view(n, nv, h * w)

    def expand_add_(self, p: Tensor, out: Tensor) -> Tensor:
        """``out += expand(p)`` in place, without an (N, R, L0) temporary.

        The row step is the gather of :meth:`expand`; the column step is a
        batched matmul with ``OX[ix]^T`` accumulating into ``out`` (exact: one
        non-zero product per entry, for finite values), one batch item at a
        time (the per-query operands are shared by the items).

        Args:
            p (Tensor): (N, R, S * S).
            out (Tensor): (N, R, L0), contiguous, of the dtype of ``p``.

        Returns:
            Tensor: ``out``.
        """
        h, w, s = self.height, self.width, self.side
        n, nv = p.shape[0], self.num_viewers
        _, ox = self.onehots(p.dtype)
        row_index = self.row_index.expand(n, nv, h, s)
        rows = p.reshape(n, nv, s, s).gather(2, row_index)  # (n, i, jy, v)
        # query i = (iy, ix): OX[ix]^T (v, jx)
        oxt = self._query_operand(ox.transpose(1, 2), False, 1)
        for k in range(n):
            out[k].view(nv, h, w).baddbmm_(rows[k], oxt)
        return out

    def reduce(self, a: Tensor) -> Tensor:
        """(N, R, L0) -> (N, R, S * S), the adjoint of :meth:`expand`.

        Reads ``a`` in place when it is contiguous or, on CPU (where a copy
        costs page faults and the per-item loop is cheap), the transpose of
        a contiguous tensor (the gradient of iRPE on queries); other layouts
        are copied.
        """
        h, w, s = self.height, self.width, self.side
        n, nv = a.shape[0], self.num_viewers
        oy, ox = self.onehots(a.dtype)
        oyt = oy.transpose(1, 2)  # (iy, u, jy)
        if is_tracing():
            # one functional batch: (n * R, S, h) @ (n * R, h, w) @ ...
            oyt_rep = self._query_operand(oyt, True, n)
            ox_rep = self._query_operand(ox, False, n)
            zy = torch.bmm(oyt_rep, a.reshape(n * nv, h, w))
            return torch.bmm(zy, ox_rep).view(n, nv, s * s)
        out = a.new_empty(n, nv, s, s)
        if (self.viewers is None and a.device.type == 'cpu'
                and not a.is_contiguous()
                and a.transpose(1, 2).is_contiguous()):
            self._reduce_transposed(a, oyt, ox, out)
            return out.view(n, nv, s * s)
        a = a.contiguous()
        # query i = (iy, ix): OY[iy]^T (u, jy) and OX[ix] (jx, v), shared by
        # the batch items
        oyt_q = self._query_operand(oyt, True, 1)
        ox_q = self._query_operand(ox, False, 1)
        for k in range(n):
            zy = torch.bmm(oyt_q, a[k].view(nv, h, w))
            torch.bmm(zy, ox_q, out=out[k].view(nv, s, s))
        return out.view(n, nv, s * s)

    def _reduce_transposed(self, a: Tensor, oyt: Tensor, ox: Tensor,
                           out: Tensor) -> None:
        """:meth:`reduce` of ``a = at.transpose(1, 2)``, ``at`` contiguous.

        ``at[n]`` is (key j, query i) = (jy, jx, iy, ix) in memory; it is read
        without a copy as a batch over (jx, iy) of (jy, ix) matrices, one
        batch item at a time (items do not merge into one batch dim).
        """
        h, w, s = self.height, self.width, self.side
        l0 = h * w
        oyt_rep = self._per_query(oyt, False, w, 1)  # (jx, iy): OY[iy]^T
        ox_rep = self._per_query(ox, False, h, 1)  # (iy, ix): OX[ix]
        for k in range(a.shape[0]):
            at = a[k].transpose(0, 1).view(h, w, h, w)  # (jy, jx, iy, ix)
            zy = torch.bmm(oyt_rep, at.permute(1, 2, 0, 3).reshape(l0, h, w))
            # (jx, iy, u, ix) -> (iy, ix, u, jx): a small copy
            zy = zy.view(w, h, s, w).permute(1, 3, 2, 0).reshape(l0, s, w)
            torch.bmm(zy, ox_rep, out=out[k].view(l0, s, s))


class CrossPlan(_BlockPlans):
    """Cross method: the row-axis and column-axis encodings are summed.

    ``T[n, i, j] = P[n, i, ry(iy, jy)] + P[n, i, S + rx(ix, jx)]``. Each
    axis is a small gather (N, L0, height) / (N, L0, width) broadcast over
    the other axis, so the only ``L0 x L0`` work is one add (forward) and
    two sums (reduce). A block of query rows slices the per-query ids.

    The axes may have different bucket counts (``side`` row buckets, then
    ``col_side`` column buckets): the decomposed relative position of
    ViTDet (:func:`get_offset_plan`) is this plan with plain offsets as
    ids, ``2 h - 1`` row and ``2 w - 1`` column entries.
    """

    def __init__(self,
                 rows: Tensor,
                 cols: Tensor,
                 side: int,
                 col_side: Optional[int] = None) -> None:
        h, w = rows.shape[0], cols.shape[0]
        self._init_grid(dict(rows=rows, cols=cols), h, w, 'cross', side)
        self.col_side = side if col_side is None else col_side
        # per query i = (iy, ix): bucket of each key row / key column
        self.row_ids = rows[:, None, :].expand(h, w, h).reshape(h * w, h)
        self.col_ids = (cols[None, :, :].expand(h, w, w).reshape(h * w, w) +
                        side)

    def _rows(self, start: int, stop: int) -> 'CrossPlan':
        plan = copy.copy(self)
        plan.viewers = (start, stop)
        plan.row_ids = self.row_ids[start:stop]
        plan.col_ids = self.col_ids[start:stop]
        return plan

    @property
    def num_spatial_buckets(self) -> int:
        """Row-axis then column-axis buckets."""
        return self.side + self.col_side

    def expand(self, p: Tensor) -> Tensor:
        """(N, R, S + S_col) -> (N, R, L0)."""
        n, nv = p.shape[0], self.num_viewers
        y = p.gather(2, self.row_ids.expand(n, nv, self.height))
        x = p.gather(2, self.col_ids.expand(n, nv, self.width))
        # (n, i, jy, 1) + (n, i, 1, jx) -> (n, i, jy * width + jx)
        return (y[..., :, None] + x[..., None, :]).view(
            n, nv, self.height * self.width)

    def reduce(self, a: Tensor) -> Tensor:
        """(N, R, L0) -> (N, R, S + S_col)."""
        h, w = self.height, self.width
        n, nv = a.shape[0], self.num_viewers
        a4 = a.unflatten(2, (h, w))  # a view in any layout, e.g. transposed
        out = a.new_zeros(n, nv, self.num_spatial_buckets)
        out.scatter_add_(2, self.row_ids.expand(n, nv, h), a4.sum(3))
        out.scatter_add_(2, self.col_ids.expand(n, nv, w), a4.sum(2))
        return out


class GatherPlan(_BlockPlans):
    """A gather with explicit bucket ids, scatter-add back.

    The plan of euclidean / quant (ids ``(L0, L0)``, built on first use from
    the per-axis distance table) and of any block made from explicit ids
    (``(R, C)``, or ``(2, R, C)`` for cross: both axes' ids, summed).

    Args:
        ids (Tensor, optional): Long ``(R, C)`` or ``(2, R, C)``.
        num_buckets (int): Columns of the per-query values.
        grid (tuple, optional): ``(tables, height, width, method, side)``
            to build the ids of the whole map lazily (and blocks of it).
    """

    def __init__(self,
                 ids: Optional[Tensor],
                 num_buckets: int,
                 grid: Optional[tuple] = None) -> None:
        self._ids, self.num_buckets = ids, num_buckets
        if grid is not None:
            self._init_grid(*grid)

    @property
    def ids(self) -> Tensor:
        """The bucket ids, built on first use (``(L0, L0)`` for a grid)."""
        if self._ids is None:
            self._ids = spatial_bucket_ids(self.tables, self.height,
                                           self.width, self.method, self.side)
        return self._ids

    def expand(self, p: Tensor) -> Tensor:
        """(N, R, nbs) -> (N, R, C)."""
        ids = self.ids
        if ids.dim() == 2:
            return p.gather(2, ids.expand(p.shape[0], -1, -1))
        return (p.gather(2, ids[0].expand(p.shape[0], -1, -1)) +
                p.gather(2, ids[1].expand(p.shape[0], -1, -1)))

    def reduce(self, a: Tensor) -> Tensor:
        """(N, R, C) -> (N, R, nbs)."""
        ids = self.ids
        n, rows = a.shape[:2]
        work = a.float() if a.dtype in (torch.float16, torch.bfloat16) else a
        out = work.new_zeros(n, rows, self.num_buckets)
        for part in ([ids] if ids.dim() == 2 else ids.unbind(0)):
            out.scatter_add_(2, part.expand(n, -1, -1), work)
        return out.to(a.dtype)


Plan = Union[ProductPlan, CrossPlan, GatherPlan]
