"""Image relative position encoding (iRPE) of queries, keys or values.

Implements the bias and contextual modes (Eq. 13-17) of `Rethinking and
Improving Relative Position Encoding for Vision Transformer
<https://arxiv.org/abs/2107.14222>`_ (Wu et al., ICCV 2021) with the
efficient computation of Eq. 26-28, improved so that neither an
``(L, L, head_dim)`` tensor nor an ``(L, L)`` gather index is needed for the
product method. Bucket ids come from :mod:`mmpe.models.layers.irpe_index`.
"""
import math
import operator
import threading
from collections import OrderedDict
from typing import Callable, Dict, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor, nn

from .irpe_index import (INDEX_FUNCS, METHODS, get_bucket_ids_2d,
                         get_num_buckets, max_index, num_buckets_per_table,
                         relative_index_1d)

# ---------------------------------------------------------------------------
# Spatial plans: (N, L0, nbs) per-query bucket values <-> (N, L0, L0) terms.
#
# ``expand`` maps P to T with T[n, i, j] = P[n, i, bucket(i, j)] (Eq. 27-28)
# and ``reduce`` is its adjoint, R[n, i, b] = sum_{j: bucket(i, j) = b}
# A[n, i, j] (the bucket-summed attention of iRPE on values, Eq. 17). Each is
# the other's backward. Only spatial tokens (L0 = height * width) and
# spatial buckets (nbs, without the skip bucket) are handled here.
# ---------------------------------------------------------------------------


class _ProductPlan:
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
      25 x 42, B=2, H=8, and is atomics on CUDA). Per-query operands
      ``OY[iy]^T`` and ``OX[ix]`` are repeated for a chunk of batch items
      sized by :attr:`max_chunk_elems`.
    """

    #: bound on the elements of the per-chunk temporaries of :meth:`reduce`
    max_chunk_elems = 2**23

    def __init__(self, rows: Tensor, cols: Tensor, side: int) -> None:
        self.height, self.width, self.side = rows.shape[0], cols.shape[0], side
        h, w = self.height, self.width
        self.rows, self.cols = rows, cols  # (h, h), (w, w) long in [0, S)
        # per query i = (iy, ix): row bucket of each key row jy, (1, L0, h, 1),
        # and column bucket of each key column jx, (1, L0, 1, w)
        l0 = h * w
        self.row_index = rows[:, None].expand(h, w, h).reshape(1, l0, h, 1)
        self.col_index = cols[None].expand(h, w, w).reshape(1, l0, 1, w)
        self._onehots: Dict[torch.dtype, Tuple[Tensor, Tensor]] = {}

    def onehots(self, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """One-hot matrices ``OY`` (h, h, S) and ``OX`` (w, w, S).

        ``OY[iy, jy, u] = [ry(iy, jy) == u]`` and likewise for ``OX``.
        """
        if dtype not in self._onehots:
            self._onehots[dtype] = (F.one_hot(self.rows, self.side).to(dtype),
                                    F.one_hot(self.cols, self.side).to(dtype))
        return self._onehots[dtype]

    def _chunk(self, n: int) -> int:
        per_item = self.height * self.width * self.side * max(
            self.height, self.width)
        return max(1, min(n, self.max_chunk_elems // per_item))

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

    def expand(self, p: Tensor) -> Tensor:
        """(N, L0, S * S) -> (N, L0, L0) contiguous, see the class docstring.
        """
        h, w, s = self.height, self.width, self.side
        n, l0 = p.shape[0], h * w
        row_index = self.row_index.expand(n, l0, h, s)
        col_index = self.col_index.expand(n, l0, h, w)
        # (n, i, u, v) -> (n, i, jy, v): the row bucket of every key row
        rows = p.reshape(n, l0, s, s).gather(2, row_index)
        # (n, i, jy, v) -> (n, i, jy, jx): the column bucket of every key
        return rows.gather(3, col_index).view(n, l0, l0)

    def expand_add_(self, p: Tensor, out: Tensor) -> Tensor:
        """``out += expand(p)`` in place, without an (N, L0, L0) temporary.

        The row step is the gather of :meth:`expand`; the column step is a
        batched matmul with ``OX[ix]^T`` accumulating into ``out`` (exact: one
        non-zero product per entry, for finite values).

        Args:
            p (Tensor): (N, L0, S * S).
            out (Tensor): (N, L0, L0), contiguous, of the dtype of ``p``.

        Returns:
            Tensor: ``out``.
        """
        h, w, s = self.height, self.width, self.side
        n, l0 = p.shape[0], h * w
        _, ox = self.onehots(p.dtype)
        row_index = self.row_index.expand(n, l0, h, s)
        rows = p.reshape(n, l0, s, s).gather(2, row_index)  # (n, i, jy, v)
        step = self._chunk(n)
        # query i = (iy, ix): OX[ix]^T (v, jx)
        oxt_rep = self._per_query(ox.transpose(1, 2), False, h, step)
        for k in range(0, n, step):
            m = min(step, n - k) * l0
            acc = out[k:k + step].view(m, h, w)
            acc.baddbmm_(rows[k:k + step].view(m, h, s), oxt_rep[:m])
        return out

    def reduce(self, a: Tensor) -> Tensor:
        """(N, L0, L0) -> (N, L0, S * S), the adjoint of :meth:`expand`.

        Reads ``a`` in place when it is contiguous or, on CPU (where a copy
        costs page faults and the per-item loop is cheap), the transpose of
        a contiguous tensor (the gradient of iRPE on queries); other layouts
        are copied.
        """
        h, w, s = self.height, self.width, self.side
        n, l0 = a.shape[0], h * w
        oy, ox = self.onehots(a.dtype)
        oyt = oy.transpose(1, 2)  # (iy, u, jy)
        out = a.new_empty(n, l0, s, s)
        if (a.device.type == 'cpu' and not a.is_contiguous()
                and a.transpose(1, 2).is_contiguous()):
            self._reduce_transposed(a, oyt, ox, out)
            return out.view(n, l0, s * s)
        a = a.contiguous()
        step = self._chunk(n)
        # query i = (iy, ix): OY[iy]^T (u, jy) and OX[ix] (jx, v)
        oyt_rep = self._per_query(oyt, True, w, step)
        ox_rep = self._per_query(ox, False, h, step)
        for k in range(0, n, step):
            m = min(step, n - k) * l0
            zy = torch.bmm(oyt_rep[:m], a[k:k + step].view(m, h, w))
            torch.bmm(zy, ox_rep[:m], out=out[k:k + step].view(m, s, s))
        return out.view(n, l0, s * s)

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


class _CrossPlan:
    """Cross method: the row-axis and column-axis encodings are summed.

    ``T[n, i, j] = P[n, i, ry(iy, jy)] + P[n, i, S + rx(ix, jx)]``. Each
    axis is a small gather (N, L0, height) / (N, L0, width) broadcast over
    the other axis, so the only ``L0 x L0`` work is one add (forward) and
    two sums (reduce).
    """

    def __init__(self, rows: Tensor, cols: Tensor, side: int) -> None:
        self.height, self.width, self.side = rows.shape[0], cols.shape[0], side
        h, w = self.height, self.width
        # per query i = (iy, ix): bucket of each key row / key column
        self.row_ids = rows[:, None, :].expand(h, w, h).reshape(h * w, h)
        self.col_ids = (cols[None, :, :].expand(h, w, w).reshape(h * w, w) +
                        side)

    def expand(self, p: Tensor) -> Tensor:
        """(N, L0, 2 S) -> (N, L0, L0)."""
        n, l0 = p.shape[0], self.height * self.width
        y = p.gather(2, self.row_ids.expand(n, l0, self.height))
        x = p.gather(2, self.col_ids.expand(n, l0, self.width))
        # (n, i, jy, 1) + (n, i, 1, jx) -> (n, i, jy * width + jx)
        return (y[..., :, None] + x[..., None, :]).view(n, l0, l0)

    def reduce(self, a: Tensor) -> Tensor:
        """(N, L0, L0) -> (N, L0, 2 S)."""
        h, w = self.height, self.width
        n, l0 = a.shape[0], h * w
        a4 = a.unflatten(2, (h, w))  # a view in any layout, e.g. transposed
        out = a.new_zeros(n, l0, 2 * self.side)
        out.scatter_add_(2, self.row_ids.expand(n, l0, h), a4.sum(3))
        out.scatter_add_(2, self.col_ids.expand(n, l0, w), a4.sum(2))
        return out


class _GatherPlan:
    """Euclidean / quant: a gather with the (L0, L0) ids, scatter-add back."""

    def __init__(self, ids: Tensor, num_buckets: int) -> None:
        self.ids, self.num_buckets = ids, num_buckets

    def expand(self, p: Tensor) -> Tensor:
        """(N, L0, nbs) -> (N, L0, L0)."""
        return p.gather(2, self.ids.expand(p.shape[0], -1, -1))

    def reduce(self, a: Tensor) -> Tensor:
        """(N, L0, L0) -> (N, L0, nbs)."""
        n, l0 = a.shape[:2]
        work = a.float() if a.dtype in (torch.float16, torch.bfloat16) else a
        out = work.new_zeros(n, l0, self.num_buckets)
        out.scatter_add_(2, self.ids.expand(n, -1, -1), work)
        return out.to(a.dtype)


_Plan = Union[_ProductPlan, _CrossPlan, _GatherPlan]


def _no_autocast(t: Tensor):
    """Context disabling autocast so a plan computes in its input dtype."""
    return torch.autocast(t.device.type, enabled=False)


class _Expand(torch.autograd.Function):
    """Differentiable ``plan.expand``; its backward is ``plan.reduce``."""

    @staticmethod
    def forward(ctx, p: Tensor, plan: _Plan) -> Tensor:
        ctx.plan = plan
        with _no_autocast(p):
            return plan.expand(p)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], None]:
        with _no_autocast(grad):
            return ctx.plan.reduce(grad), None


class _ExpandAdd(torch.autograd.Function):
    """``out += plan.expand(p)`` in place (product plans only)."""

    @staticmethod
    def forward(ctx, out: Tensor, p: Tensor, plan: _Plan) -> Tensor:
        ctx.plan = plan
        ctx.mark_dirty(out)
        with _no_autocast(p):
            # out: (..., L0, L0) with the leading dims flattened in p
            plan.expand_add_(p, out.view(p.shape[0], *out.shape[-2:]))
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Tensor, Optional[Tensor], None]:
        with _no_autocast(grad):
            flat = grad.reshape(-1, *grad.shape[-2:])
            return grad, ctx.plan.reduce(flat), None


class _Reduce(torch.autograd.Function):
    """Differentiable ``plan.reduce``; its backward is ``plan.expand``."""

    @staticmethod
    def forward(ctx, a: Tensor, plan: _Plan) -> Tensor:
        ctx.plan = plan
        with _no_autocast(a):
            return plan.reduce(a)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], None]:
        with _no_autocast(grad):
            return ctx.plan.expand(grad), None


# ---------------------------------------------------------------------------
# Bounded LRU cache of plans, shared by all iRPE modules of a process (e.g.
# the 6 encoder layers of DETR build a size's plan once).
# ---------------------------------------------------------------------------


class CacheInfo(NamedTuple):
    """Statistics of the bucket-id cache."""
    hits: int
    misses: int
    size: int
    maxsize: int


class _LRUCache:
    """A small thread-safe least-recently-used cache with hit / miss counters.
    """

    def __init__(self, maxsize: int = 32) -> None:
        self.maxsize = maxsize
        self._data: 'OrderedDict[tuple, object]' = OrderedDict()
        self._lock = threading.Lock()  # e.g. nn.DataParallel replicas
        self.hits = self.misses = 0

    def get(self, key: tuple, build: Callable[[], object]) -> object:
        with self._lock:
            if key in self._data:
                self.hits += 1
                self._data.move_to_end(key)
                return self._data[key]
            self.misses += 1
            value = build()
            self._data[key] = value
            if len(self._data) > self.maxsize:
                self._data.popitem(last=False)
            return value

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self.hits, self.misses, len(self._data),
                             self.maxsize)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0


_PLAN_CACHE = _LRUCache(maxsize=32)


@MODELS.register_module()
class iRPE(BaseModule):
    """Image relative position encoding on queries, keys or values.

    For a grid of ``height x width`` tokens after ``skip`` leading tokens
    (``L = skip + height * width``), every (query i, key j) pair has a bucket
    ``b(i, j)`` (see :func:`~mmpe.models.layers.irpe_index.get_bucket_ids_2d`)
    and the module returns the term it contributes to attention:

    * ``on='k'`` (Eq. 16, ``r^K``): ``x`` are the queries,
      ``out[i, j] = x_i . r_b(i, j)`` (contextual) or ``r_b(i, j)`` (bias),
      added to the logit of query ``i`` and key ``j``.
    * ``on='q'`` (``r^Q``): ``x`` are the keys,
      ``out[i, j] = x_j . r_b(j, i)`` (bias: ``r_b(j, i)``), added to the
      logit of query ``i`` and key ``j``. The bucket is taken from the key's
      point of view, ``b(j, i)`` (relative position key minus query), exactly
      as the authors' release computes ``rpe_q(k).transpose(-2, -1)``; for
      the undirected euclidean / quant methods and skip pairs
      ``b(j, i) = b(i, j)``, for product / cross it is the mirrored bucket.
    * ``on='v'`` (Eq. 17, contextual only): ``x`` are the attention
      probabilities, ``out[i] = sum_j x_ij r_b(i, j)``, added to the output of
      query ``i``.

    Contextual on q / k computes ``x @ table^T`` (B, H, L, num_buckets) and
    expands it to (L, L) (Eq. 27-28); on v it sums the attention per bucket
    (B, H, L, num_buckets) and multiplies by the table; no
    ``(L, L, head_dim)`` tensor is formed. For the product method the
    expansion is a pair of batched one-hot matmuls (the bucket factorises
    into a row part and a column part), for cross two per-axis gathers and a
    broadcast add, for euclidean / quant a gather. Bias mode does not depend
    on ``x`` beyond its dtype and device and returns a (1, H, L, L) term.

    Args:
        head_dim (int): Channels per head.
        num_heads (int): Number of attention heads.
        mode (str): 'bias' or 'contextual'. Defaults to 'contextual'.
        method (str): 'euclidean', 'quant', 'cross' or 'product'. Defaults
            to 'product'.
        on (str): 'q', 'k' or 'v' (bias: 'q' or 'k'). Defaults to 'k'.
        index (str): 'piecewise' (Eq. 18) or 'clip' (Shaw et al.). Defaults
            to 'piecewise'.
        ratio (float): ``alpha`` of the piecewise function, with
            ``alpha : beta : gamma = 1 : 2 : 8``; 1.9 gives 7 x 7 product
            buckets, 2.0 gives 9 x 9. Defaults to 1.9.
        max_distance (int, optional): ``k`` of the clip function; required
            (and only allowed) with ``index='clip'``. Defaults to None.
        shared_head (bool): Share one table among the heads. Defaults to True.
        skip (int): Leading non-spatial tokens (e.g. a class token), all
            pairs involving them use one extra bucket. Defaults to 0.
        init (str): Initialisation of :attr:`table`: 'zeros' (the paper),
            'xavier' (``xavier_uniform_`` with the fans of the authors' table
            layout, which their DETR code ends up applying) or
            'trunc_normal' (std 0.02). Defaults to 'zeros'.
        init_cfg (dict or list[dict], optional): mmengine init config.
            Defaults to None.

    Attributes:
        num_buckets (int): Rows of :attr:`table`; cross stacks the row-axis
            buckets then the column-axis buckets (each with its own skip
            bucket).
        table (nn.Parameter): Bias ``(H', num_buckets)``; contextual
            ``(H', num_buckets, head_dim)``; ``H' = 1`` if ``shared_head``
            else ``num_heads``. From the authors' release: contextual q / k
            ``lookup_table_weight`` (H', head_dim, nb) is ``table``
            transposed (1, 2); v ``lookup_table_weight`` (H', nb, head_dim)
            and ``lookup_table_bias`` (H', nb) are ``table`` as is; cross
            concatenates ``rp_rows`` then ``rp_cols`` along the buckets.
    """

    MODES = ('bias', 'contextual')
    METHODS = METHODS
    ONS = ('q', 'k', 'v')
    INDEX_FUNCS = INDEX_FUNCS
    INITS = ('zeros', 'xavier', 'trunc_normal')

    def __init__(self,
                 head_dim: int,
                 num_heads: int,
                 mode: str = 'contextual',
                 method: str = 'product',
                 on: str = 'k',
                 index: str = 'piecewise',
                 ratio: float = 1.9,
                 max_distance: Optional[int] = None,
                 shared_head: bool = True,
                 skip: int = 0,
                 init: str = 'zeros',
                 init_cfg: Optional[Union[dict, list]] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        _check_positive_int('head_dim', head_dim)
        _check_positive_int('num_heads', num_heads)
        _check_choice('mode', mode, self.MODES)
        _check_choice('method', method, self.METHODS)
        _check_choice('on', on, self.ONS)
        _check_choice('index', index, self.INDEX_FUNCS)
        _check_choice('init', init, self.INITS)
        if mode == 'bias' and on == 'v':
            raise ValueError(
                "Unsupported `on` 'v' with `mode` 'bias' (a bias on values "
                "is not defined), please choose `on` from ('q', 'k') or "
                "`mode` 'contextual'")
        if (isinstance(ratio, bool) or not isinstance(ratio, (int, float))
                or not math.isfinite(ratio) or ratio <= 0):
            raise ValueError(f'Unsupported `ratio` {ratio!r}, please choose '
                             'a finite number > 0 (e.g. 1.9 or 2.0)')
        if index == 'clip':
            if (isinstance(max_distance, bool)
                    or not isinstance(max_distance, int) or max_distance <= 0):
                raise ValueError(
                    f'Unsupported `max_distance` {max_distance!r} with '
                    "`index` 'clip', please choose an int > 0")
        elif max_distance is not None:
            raise ValueError(
                f'Unsupported `max_distance` {max_distance!r} with `index` '
                f"{index!r}, please choose None (it only applies to `index` "
                "'clip')")
        if not isinstance(shared_head, bool):
            raise ValueError(f'Unsupported `shared_head` {shared_head!r}, '
                             'please choose from (True, False)')
        if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
            raise ValueError(
                f'Unsupported `skip` {skip!r}, please choose an int >= 0')

        self.head_dim = head_dim
        self.num_heads = num_heads
        self.mode = mode
        self.method = method
        self.on = on
        self.index = index
        self.ratio = float(ratio)
        self.max_distance = max_distance
        self.shared_head = shared_head
        self.skip = skip
        self.init = init
        self.num_buckets = get_num_buckets(method, index, self.ratio,
                                           max_distance, skip)
        heads = 1 if shared_head else num_heads
        shape = (heads, self.num_buckets)
        if mode == 'contextual':
            shape += (head_dim, )
        self.table = nn.Parameter(torch.zeros(shape))
        self.reset_table()

    # ------------------------------------------------------------------
    # initialisation
    # ------------------------------------------------------------------
    @torch.no_grad()
    def reset_table(self) -> None:
        """(Re-)initialise :attr:`table` according to ``init``."""
        if self.init == 'zeros':
            self.table.zero_()
        elif self.init == 'trunc_normal':
            nn.init.trunc_normal_(self.table, std=0.02)
        else:
            # the authors' layout: bias (H', nb), q / k (H', head_dim, nb),
            # v (H', nb, head_dim); xavier there, then into ours
            t = self.table
            if self.mode == 'contextual' and self.on != 'v':
                t = t.transpose(1, 2)
            tmp = torch.empty(t.shape, dtype=t.dtype, device=t.device)
            nn.init.xavier_uniform_(tmp)
            t.copy_(tmp)

    def init_weights(self) -> None:
        """Apply ``init`` then any ``init_cfg`` (mmengine convention)."""
        self.reset_table()
        super().init_weights()

    # ------------------------------------------------------------------
    # bucket ids and the plan cache
    # ------------------------------------------------------------------
    @staticmethod
    def cache_info() -> CacheInfo:
        """Hits, misses and size of the process-wide bucket-id cache."""
        return _PLAN_CACHE.info()

    @staticmethod
    def cache_clear() -> None:
        """Empty the bucket-id cache and reset its counters."""
        _PLAN_CACHE.clear()

    def _config_key(self) -> tuple:
        return (self.method, self.index, self.ratio, self.max_distance)

    def _plan(self, height: int, width: int, device: torch.device) -> _Plan:
        """The cached plan of a grid, keyed by everything it depends on."""
        key = self._config_key() + (height, width, self.skip, device)
        return _PLAN_CACHE.get(key,
                               lambda: self._build_plan(height, width, device))

    def _build_plan(self, height: int, width: int,
                    device: torch.device) -> _Plan:
        b = max_index(self.index, self.ratio, self.max_distance)
        side = 2 * b + 1
        if self.method in ('product', 'cross'):
            args = (self.index, self.ratio, self.max_distance, device)
            rows = relative_index_1d(height, *args) + b
            cols = relative_index_1d(width, *args) + b
            cls = _ProductPlan if self.method == 'product' else _CrossPlan
            return cls(rows, cols, side)
        ids = get_bucket_ids_2d(height, width, self.method, self.index,
                                self.ratio, self.max_distance, 0, device)
        return _GatherPlan(ids, side)

    def bucket_ids(
            self,
            height: int,
            width: int,
            device: Optional[Union[str, torch.device]] = None) -> Tensor:
        """Bucket id of every (query, key) pair, an index into :attr:`table`.

        Args:
            height (int): Grid height.
            width (int): Grid width.
            device (str | torch.device, optional): Defaults to the table's.

        Returns:
            Tensor: Long (L, L), ``L = skip + height * width``, entry
            ``[i, j]`` for query ``i`` and key ``j``; cross: (2, L, L), the
            row-axis ids then the column-axis ids (offset past the row-axis
            buckets).
        """
        height, width = _check_grid(height, width)
        device = self.table.device if device is None else device
        return get_bucket_ids_2d(height, width, self.method, self.index,
                                 self.ratio, self.max_distance, self.skip,
                                 device)

    # ------------------------------------------------------------------
    # forward
    # ------------------------------------------------------------------
    def forward(self,
                x: Tensor,
                height: int,
                width: int,
                logits: Optional[Tensor] = None) -> Tensor:
        """Compute the iRPE term.

        Args:
            x (Tensor): on 'k': queries (B, num_heads, L, head_dim); on 'q':
                keys (B, num_heads, L, head_dim); on 'v': attention
                probabilities (B, num_heads, L, L). Bias mode only uses its
                dtype and device. ``L = skip + height * width``.
            height (int): Grid height.
            width (int): Grid width.
            logits (Tensor, optional): on 'q' / 'k' only, attention logits
                (B, num_heads, L, L) to add the term to **in place**; they are
                returned. Saves the (B, num_heads, L, L) temporaries of
                ``logits + term`` (for contextual product on 'k' without skip
                tokens the term is never materialised). Autograd-safe: the
                logits must not be needed by another backward (true for the
                output of ``q @ k^T``). Defaults to None.

        Returns:
            Tensor: on 'q' / 'k': (B, num_heads, L, L) (bias: (1, num_heads,
            L, L)), the term added to the logit of query ``i`` and key ``j``,
            or ``logits`` plus the term if given; on 'v': (B, num_heads, L,
            head_dim). In the dtype of ``x`` (autocast may lower the matmuls).
        """
        height, width = _check_grid(height, width)
        length = self.skip + height * width
        if x.dim() != 4:
            raise ValueError(f'iRPE expects a 4D input (B, num_heads, L, *), '
                             f'got shape {tuple(x.shape)}')
        if x.shape[2] != length:
            raise ValueError(
                f'iRPE input length {x.shape[2]} != skip + height * width = '
                f'{self.skip} + {height} * {width} = {length}')
        if x.shape[1] != self.num_heads:
            raise ValueError(f'iRPE input has {x.shape[1]} heads, expected '
                             f'num_heads = {self.num_heads}')
        last = length if self.on == 'v' else self.head_dim
        if self.mode == 'contextual' and x.shape[3] != last:
            raise ValueError(f'iRPE on {self.on!r} expects a last dim of '
                             f'{last}, got {x.shape[3]}')
        if logits is not None:
            shape = (x.shape[0], self.num_heads, length, length)
            if self.on == 'v' or tuple(logits.shape) != shape:
                raise ValueError(
                    f'iRPE `logits` must be (B, num_heads, L, L) = {shape} '
                    f"with `on` in ('q', 'k'), got shape "
                    f'{tuple(logits.shape)} and `on` {self.on!r}')
        plan = self._plan(height, width, x.device)
        if self.on == 'v':
            return self._forward_v(x, plan)
        table = self.table.to(x.dtype)
        if self.mode == 'bias':
            # per-query values are the table itself: expand (H', L, nb)
            values = table[:, None, :].expand(-1, length, -1)
            term = self._expand(values, plan)[None]  # (1, H', L, L)
            if self.on == 'q':  # r^Q uses b(j, i), as the authors' release
                # before the head expansion, so that the backward sums the
                # heads of a contiguous gradient
                term = term.transpose(-1, -2)
            term = term.expand(1, self.num_heads, length, length)
            return self._finish(term, logits)

        b, h = x.shape[:2]
        if self.shared_head:
            values = torch.matmul(x, table[0].t())  # (B, H, L, nb)
        else:
            values = torch.matmul(x, table.transpose(1, 2))
        values = values.reshape(b * h, length, -1)
        if (logits is not None and self.on == 'k' and self.skip == 0
                and isinstance(plan, _ProductPlan) and logits.is_contiguous()
                and logits.dtype == values.dtype):
            # the whole logits (not a view of them) go in: in-place ops on
            # views cost autograd a copy of the gradient
            return _ExpandAdd.apply(logits, values, plan)
        term = self._expand(values, plan).view(b, h, length, length)
        if self.on == 'q':  # r^Q uses b(j, i), as the authors' release
            term = term.transpose(-1, -2)
        return self._finish(term, logits)

    @staticmethod
    def _finish(term: Tensor, logits: Optional[Tensor]) -> Tensor:
        return term if logits is None else logits.add_(term)

    def _forward_v(self, attn: Tensor, plan: _Plan) -> Tensor:
        """Eq. 17 as (bucket-summed attention) @ table."""
        b, h, length = attn.shape[:3]
        summed = self._reduce(attn.reshape(b * h, length, length), plan)
        summed = summed.view(b, h, length, self.num_buckets)
        table = self.table.to(attn.dtype)
        if self.shared_head:
            return torch.matmul(summed, table[0])  # (B, H, L, head_dim)
        return torch.matmul(summed, table)

    # -- skip tokens and the cross table layout around the spatial plans --
    def _spatial_slices(self) -> Tuple[slice, ...]:
        """Table rows of the spatial buckets, in the plan's order."""
        per = num_buckets_per_table(self.method, self.index, self.ratio,
                                    self.max_distance, self.skip)
        spatial = per - int(self.skip > 0)
        if self.method == 'cross':
            return slice(0, spatial), slice(per, per + spatial)
        return (slice(0, spatial), )

    def _extra_ids(self) -> Tuple[int, ...]:
        """Table rows of the skip bucket(s) (cross: one per axis)."""
        per = num_buckets_per_table(self.method, self.index, self.ratio,
                                    self.max_distance, self.skip)
        return (per - 1,
                2 * per - 1) if self.method == 'cross' else (per - 1, )

    def _expand(self, values: Tensor, plan: _Plan) -> Tensor:
        """(N, L, num_buckets) -> (N, L, L), ``out[n, i, j] = values[n, i,
        b(i, j)]``."""
        slices = self._spatial_slices()
        skip = self.skip
        spatial = values[:, skip:]
        if len(slices) == 1:
            spatial = spatial[..., slices[0]]
        else:
            spatial = torch.cat([spatial[..., s] for s in slices], dim=-1)
        term = _Expand.apply(spatial, plan)  # (N, L0, L0)
        if skip == 0:
            return term
        extra = sum(values[..., e] for e in self._extra_ids())  # (N, L)
        n, length = extra.shape
        l0 = length - skip
        # every pair with a skip token (row < skip or column < skip)
        top = extra[:, :skip, None].expand(n, skip, length)
        left = extra[:, skip:, None].expand(n, l0, skip)
        return torch.cat([top, torch.cat([left, term], dim=2)], dim=1)

    def _reduce(self, attn: Tensor, plan: _Plan) -> Tensor:
        """(N, L, L) -> (N, L, num_buckets), the adjoint of :meth:`_expand`."""
        skip = self.skip
        n, length = attn.shape[:2]
        spatial = attn[:, skip:, skip:]
        if skip:
            spatial = spatial.contiguous()
        summed = _Reduce.apply(spatial, plan)  # (N, L0, nbs)
        if skip == 0:
            return summed
        # bucket-sum of the skip pairs of each query row
        extra = torch.cat(
            [attn[:, :skip].sum(2), attn[:, skip:, :skip].sum(2)],
            dim=1)[..., None]  # (N, L, 1)
        # skip queries have no spatial pairs: zero spatial sums
        summed = torch.cat(
            [summed.new_zeros(n, skip, summed.shape[2]), summed],
            dim=1)  # (N, L, nbs)
        parts = []
        for part in summed.split(
            [s.stop - s.start for s in self._spatial_slices()], dim=2):
            parts += [part, extra]  # cross: each axis' skip bucket
        return torch.cat(parts, dim=2)


def _check_choice(name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f'Unsupported `{name}` {value!r}, please choose from '
                         f'{choices}')


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f'Unsupported `{name}` {value!r}, please choose an int > 0')


def _check_grid(height: int, width: int) -> Tuple[int, int]:
    """Validate a grid size; accepts any integer type (e.g. numpy ints)."""
    out = []
    for name, value in (('height', height), ('width', width)):
        try:
            ok = not isinstance(value, bool) and operator.index(value) > 0
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(
                f'Unsupported `{name}` {value!r}, please choose an int > 0')
        out.append(operator.index(value))
    return out[0], out[1]
