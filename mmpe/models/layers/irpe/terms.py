"""iRPE as a relative term of the attention core, on any rows of queries.

The terms of Eq. 16-17 of `Rethinking and Improving Relative Position
Encoding for Vision Transformer <https://arxiv.org/abs/2107.14222>`_ (Wu et
al., ICCV 2021) in the interface of
:mod:`~mmpe.models.layers.terms.relative_term`: for a block of (viewer,
other) token pairs - a range of query rows against all keys (iRPE on keys
and values), or all keys against a range of query rows (iRPE on queries,
whose bucket is seen from the key, ``b(j, i)``) - the per-bucket values of
the viewers are expanded to the block (Eq. 27-28) and the block is reduced
back per bucket (the adjoint, and Eq. 17's bucket-summed probabilities).
Skip tokens (their one extra bucket per table) and the cross layout
(row-axis then column-axis buckets) are handled here around the spatial
plans of :mod:`~mmpe.models.layers.irpe.plans`. The whole map is the block
``rows=None``: the explicit backend runs exactly this code on all rows, the
chunked backend on ranges of rows.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..common.tracing import is_tracing
from ..terms.registry import register_term
from ..terms.relative_term import AxisValues, RelativeTerm, Rows
from .index import BucketSpec
from .plan_cache import get_plan
from .plan_ops import Expand, ExpandAdd, Reduce
from .plans import CrossPlan, ProductPlan


def bucket_lookup(x: Tensor, table: Tensor, shared: bool) -> Tensor:
    """Eq. 27's per-bucket lookup ``x @ table^T``.

    Args:
        x (Tensor): Scaled queries (iRPE on keys) or keys (on queries),
            (B, H, R, d).
        table (Tensor): (H', num_buckets, d), ``H' = 1`` if ``shared``.
        shared (bool): One table for all heads.

    Returns:
        Tensor: (B, H, R, num_buckets).
    """
    if shared:
        return torch.matmul(x, table[0].t())
    return torch.matmul(x, table.transpose(1, 2))


def lookup_backward(x: Tensor, table: Tensor, shared: bool, grad: Tensor,
                    rows: Rows, grads: List[Tensor]) -> None:
    """The adjoint of :func:`bucket_lookup` on a range of viewer rows.

    Through ``lookup = x @ table^T`` of the rows (None: all):
    ``dx += dlookup @ table``, ``dtable += dlookup^T x``, accumulated into
    ``grads = [dx, dtable]`` (shapes of ``x`` and ``table``).

    Args:
        x (Tensor): (B, H, L, d), all rows.
        table (Tensor): (H', nb, d).
        shared (bool): One table for all heads (``H' = 1``).
        grad (Tensor): ``dL/dlookup`` of the rows (B, H, R, nb).
        rows (tuple[int, int], optional): The rows; None: all.
        grads (list[Tensor]): ``[dx, dtable]``, added to.
    """
    if rows is not None:
        x = x[:, :, rows[0]:rows[1]]
    dx = grads[0] if rows is None else grads[0][:, :, rows[0]:rows[1]]
    if shared:
        dx += torch.matmul(grad, table[0])
        grads[1][0].addmm_(
            grad.reshape(-1, grad.shape[-1]).t(), x.reshape(-1, x.shape[-1]))
    else:
        dx += torch.matmul(grad, table)
        grads[1].add_(torch.matmul(grad.transpose(-1, -2), x).sum(0))


def _spatial_range(span: Rows, skip: int) -> Rows:
    """Token range -> spatial range (skip tokens dropped); None stays."""
    if span is None:
        return None
    return max(span[0], skip) - skip, span[1] - skip


@register_term
class IRPETerm(RelativeTerm):
    """iRPE on queries, keys or values for one call.

    Args (those of :class:`RelativeTerm`):
        spec (dict): :meth:`iRPE.term_spec` of the module.
        tensors (list[Tensor]): Contextual on q / k: the scaled queries (on
            'k') or keys (on 'q') ``x`` (B, H, L, head_dim) and the table
            (H', num_buckets, head_dim); the lookup ``x @ table^T`` (B, H,
            L, num_buckets) is computed from them, for the rows at hand
            (on 'k') or once per pass (on 'q'), so neither it nor its
            gradient outlives a pass. Bias: the table (H', num_buckets);
            on v: the table (H', num_buckets, head_dim). In the dtype of
            the attention.
        height (int): Grid height.
        width (int): Grid width.
        length (int): Tokens ``skip + height * width``.
        spec_json (str, optional): ``spec`` as JSON.
    """

    kind = 'irpe'

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        spec = self._spec
        self.on, self.mode = spec['on'], spec['mode']
        self.target = 'values' if self.on == 'v' else 'logits'
        self.skip = spec['skip']
        self.slices = tuple(slice(a, b) for a, b in spec['slices'])
        self.extras = tuple(spec['extras'])
        self.num_buckets = spec['num_buckets']
        self._plan = None
        self._shared = spec['shared_head']
        # per pass (chunked backend): the whole lookup of iRPE on queries,
        # its gradient, and the value term's dL/d(bucket sums)
        self._lookup_all: Optional[Tensor] = None
        self._grad_lookup: Optional[Tensor] = None

    @property
    def plan(self):
        """The grid's spatial plan (cached process-wide), on first use: a
        traced call that only hands the term to the custom op never builds
        it."""
        if self._plan is None:
            spec = self._spec
            buckets = BucketSpec(spec['method'], spec['index'], spec['ratio'],
                                 spec['max_distance'])
            self._plan = get_plan(buckets, self.height, self.width,
                                  self.tensors[0].device, spec['side'])
        return self._plan

    # ------------------------------------------------------------------
    # the block math: (N, Rv, nb) viewer values <-> (N, Rv, Ro) terms
    # ------------------------------------------------------------------
    def _spatial_values(self, values: Tensor) -> Tensor:
        """(N, R, nb) -> (N, R, nbs): the spatial buckets, in plan order."""
        if len(self.slices) == 1:
            return values[..., self.slices[0]]
        return torch.cat([values[..., s] for s in self.slices], dim=-1)

    def _offsets(self, viewers: Rows, others: Rows) -> Tuple[int, int]:
        """Local index of the first spatial viewer / other of a block."""
        skip = self.skip
        vs = skip if viewers is None else max(viewers[0], skip) - viewers[0]
        os_ = skip if others is None else max(others[0], skip) - others[0]
        return vs, os_

    def expand(self, values: Tensor, viewers: Rows = None,
               others: Rows = None) -> Tensor:
        """(N, Rv, nb) values of the viewer tokens ``viewers`` -> their
        terms with the ``others`` tokens (N, Rv, Ro): ``out[n, a, c] =
        values[n, a, b(viewer a, other c)]`` (None: all tokens)."""
        skip = self.skip
        if skip == 0:
            return Expand.apply(self._spatial_values(values),
                                self.plan.block(viewers, others))
        n, rv = values.shape[:2]
        ro = self.length if others is None else others[1] - others[0]
        vs, os_ = self._offsets(viewers, others)
        # every pair with a skip token uses the extra bucket(s)
        extra = sum(values[..., e] for e in self.extras)  # (N, Rv)
        if (viewers is not None and vs == rv) or (others is not None
                                                  and os_ == ro):
            return extra[:, :, None].expand(n, rv, ro)
        top = extra[:, :vs, None].expand(n, vs, ro)
        left = extra[:, vs:, None].expand(n, rv - vs, os_)
        plan = self.plan.block(_spatial_range(viewers, skip),
                               _spatial_range(others, skip))
        term = Expand.apply(self._spatial_values(values[:, vs:]), plan)
        return torch.cat([top, torch.cat([left, term], dim=2)], dim=1)

    def reduce(self, a: Tensor, viewers: Rows = None,
               others: Rows = None) -> Tensor:
        """(N, Rv, Ro) -> (N, Rv, nb), the adjoint of :meth:`expand`."""
        skip = self.skip
        if skip == 0:
            return Reduce.apply(a, self.plan.block(viewers, others))
        n, rv, ro = a.shape
        vs, os_ = self._offsets(viewers, others)
        nbs = sum(s.stop - s.start for s in self.slices)
        if (viewers is not None and vs == rv) or (others is not None
                                                  and os_ == ro):
            summed = a.new_zeros(n, rv - vs, nbs)
        else:
            plan = self.plan.block(_spatial_range(viewers, skip),
                                   _spatial_range(others, skip))
            summed = Reduce.apply(a[:, vs:, os_:].contiguous(), plan)
        # bucket-sum of the skip pairs of each viewer row
        extra = torch.cat([a[:, :vs].sum(2), a[:, vs:, :os_].sum(2)],
                          dim=1)[..., None]  # (N, Rv, 1)
        # skip viewers have no spatial pairs: zero spatial sums
        summed = torch.cat([summed.new_zeros(n, vs, nbs), summed], dim=1)
        parts = []
        for part in summed.split([s.stop - s.start for s in self.slices],
                                 dim=2):
            parts += [part, extra]  # cross: each axis' skip bucket
        return torch.cat(parts, dim=2)

    def _add_expanded(self, buf: Tensor, values: Tensor, rows: Rows) -> Tensor:
        """``buf`` (B, H, R, L) ``+=`` the expansion of ``values``
        (B * H, R, nb) of the query rows ``rows`` against all keys."""
        b, h, r, length = buf.shape
        if (self.skip == 0 and isinstance(self.plan, ProductPlan)
                and buf.is_contiguous() and buf.dtype == values.dtype
                and not is_tracing()):
            # the whole buffer (not a view of it) goes in: in-place ops on
            # views cost autograd a copy of the gradient. Eager only: a
            # traced graph needs functional ops and fuses the add itself
            return ExpandAdd.apply(buf, values,
                                   self.plan.block(rows, None))
        return buf.add_(self.expand(values, rows).view(b, h, r, length))

    # ------------------------------------------------------------------
    # logit terms (on q, k)
    # ------------------------------------------------------------------
    def _bias_term(self, heads: int, rows: Rows) -> Tensor:
        """Bias mode: (1, heads, R, L) from the table (H', nb)."""
        table, length = self.tensors[0], self.length
        r = length if rows is None else rows[1] - rows[0]
        if self.on == 'k':
            values = table[:, None, :].expand(-1, r, -1)  # (H', R, nb)
            term = self.expand(values, rows)[None]
        else:  # r^Q uses b(j, i), as the authors' release
            # before the head expansion, so that the backward sums the
            # heads of a contiguous gradient
            values = table[:, None, :].expand(-1, length, -1)
            term = self.expand(values, None, rows)[None].transpose(-1, -2)
        return term.expand(1, heads, r, length)

    def _lookup(self, rows: Rows) -> Tensor:
        """The lookup (B, H, R, nb) of the viewer rows ``rows``; on 'q' the
        viewers are the keys, all of them, computed once per pass."""
        x, table = self.tensors
        if rows is None:
            return bucket_lookup(x, table, self._shared)
        if self.on == 'k':
            return bucket_lookup(x[:, :, rows[0]:rows[1]], table,
                                 self._shared)
        if self._lookup_all is None:
            self._lookup_all = bucket_lookup(x, table, self._shared)
        return self._lookup_all

    def _contextual_q_term(self, rows: Rows) -> Tensor:
        """Contextual on q: (B, H, R, L), ``T[i, j] = lookup[j, b(j, i)]``
        for the query rows, a transposed view."""
        lookup = self._lookup(None if rows is None else (0, self.length))
        b, h, length = lookup.shape[:3]
        r = length if rows is None else rows[1] - rows[0]
        term = self.expand(lookup.reshape(b * h, length, -1), None, rows)
        return term.view(b, h, length, r).transpose(-1, -2)

    def dense(self) -> Tuple[Tensor, bool]:
        if self.mode == 'bias':
            return self._bias_term(self._spec['num_heads'], None), False
        if self.on == 'q':
            return self._contextual_q_term(None), True
        lookup = self._lookup(None)
        b, h, length = lookup.shape[:3]
        term = self.expand(lookup.reshape(b * h, length, -1))
        return term.view(b, h, length, length), True

    @property
    def axis_layout(self) -> Optional[str]:
        """The product and cross methods on queries, keys or values: values
        over per-axis buckets (Eq. 27's lookup, the bias table, or the value
        table), skip tokens with their extra bucket(s)."""
        method = self._spec['method']
        return method if method in ('product', 'cross') else None

    @property
    def axis_on(self) -> str:
        return self.on

    @property
    def axis_shared(self) -> bool:
        """The bias mode on queries or keys: one table for every token."""
        return self.mode == 'bias' and self.on != 'v'

    def axis_values(self) -> AxisValues:
        plan = self.plan
        if self.on == 'v':
            values = self.tensors[0]  # (H', nb, d)
        elif self.mode == 'bias':
            values = self.tensors[0][None, :, None, :]  # (1, H', 1, nb)
        else:  # the lookup of the queries (on 'k') or keys (on 'q')
            x, table = self.tensors
            values = bucket_lookup(x, table, self._shared)  # (B, H, L, nb)
        cross = isinstance(plan, CrossPlan)
        return AxisValues(
            values, plan.tables['rows'], plan.tables['cols'],
            'cross' if cross else 'product', plan.side,
            plan.col_side if cross else plan.side,
            # the column table's buckets follow the row table's (and its
            # skip bucket)
            col_offset=self.slices[-1].start if cross else None,
            skip=self.skip, extras=self.extras if self.skip else (),
            on=self.on)

    def add_rows(self, logits: Tensor, rows: Rows) -> Tensor:
        if self.mode == 'bias':
            return logits.add_(self._bias_term(logits.shape[1], rows))
        if self.on == 'q':
            return logits.add_(self._contextual_q_term(rows))
        lookup = self._lookup(rows)
        b, h, r = lookup.shape[:3]
        return self._add_expanded(logits, lookup.reshape(b * h, r, -1), rows)

    # ------------------------------------------------------------------
    # value term (on v, contextual): z_i += sum_j p_ij r_b(i, j)
    # ------------------------------------------------------------------
    def _bucket_sums(self, probs: Tensor, rows: Rows) -> Tensor:
        """Eq. 17's bucket-summed probabilities (B, H, R, nb)."""
        b, h, r, length = probs.shape
        summed = self.reduce(probs.reshape(b * h, r, length), rows)
        return summed.view(b, h, r, self.num_buckets)

    def out_rows(self, probs: Tensor, rows: Rows) -> Tensor:
        table = self.tensors[0]
        summed = self._bucket_sums(probs, rows)
        if self._spec['shared_head']:
            return torch.matmul(summed, table[0])  # (B, H, R, head_dim)
        return torch.matmul(summed, table)

    def begin_backward(self, grad_out: Tensor) -> None:
        if self.target != 'values':
            return
        table = self.tensors[0]
        # dL/d(summed) = dL/dz @ table^T, (B, H, L, nb)
        if self._spec['shared_head']:
            self._grad_lookup = torch.matmul(grad_out, table[0].t())
        else:
            self._grad_lookup = torch.matmul(grad_out, table.transpose(1, 2))

    # ------------------------------------------------------------------
    # the adjoint on a range of rows (chunked backend)
    # ------------------------------------------------------------------
    def backward_rows(self, grad: Tensor, rows: Tuple[int, int],
                      grads: List[Tensor], probs: Optional[Tensor] = None,
                      grad_out: Optional[Tensor] = None) -> None:
        b, h, r, length = grad.shape
        start, stop = rows
        if self.target == 'values':
            g = self._grad_lookup[:, :, start:stop].reshape(b * h, r, -1)
            self._add_expanded(grad, g, rows)  # dL/dp += dL/dz . r_b(i, j)
            summed = self._bucket_sums(probs, rows)  # (B, H, R, nb)
            # dL/dtable = summed^T dL/dz, over batch, rows (and heads)
            if self._spec['shared_head']:
                grads[0][0].addmm_(
                    summed.reshape(-1, self.num_buckets).t(),
                    grad_out.reshape(-1, grad_out.shape[-1]))
            else:
                grads[0].add_(
                    torch.matmul(summed.transpose(-1, -2), grad_out).sum(0))
            return
        if self.mode == 'bias':
            g = grad.sum(0)  # (H, R, L): the table is shared by the batch
            if grads[0].shape[0] == 1:
                g = g.sum(0, keepdim=True)  # and by the heads
            if self.on == 'k':
                red = self.reduce(g, rows)  # (H', R, nb)
            else:
                red = self.reduce(g.transpose(1, 2), None, rows)  # (H', L, nb)
            grads[0].add_(red.sum(1))
            return
        if self.on == 'k':
            red = self.reduce(grad.reshape(b * h, r, length), rows)
            self._lookup_backward(red.view(b, h, r, -1), rows, grads)
            return
        # on 'q' the rows are the others of every key's block: accumulate
        # the gradient of the whole lookup, taken through at end_backward
        g = grad.reshape(b * h, r, length).transpose(1, 2)  # (N, L, R)
        red = self.reduce(g, None, rows).view(b, h, length, -1)
        if self._grad_lookup is None:
            self._grad_lookup = red
        else:
            self._grad_lookup += red

    def end_backward(self, grads: List[Tensor]) -> None:
        if self.mode == 'contextual' and self.on == 'q' and (
                self._grad_lookup is not None):
            self._lookup_backward(self._grad_lookup, None, grads)
        self._grad_lookup = self._lookup_all = None

    def _lookup_backward(self, grad: Tensor, rows: Rows,
                         grads: List[Tensor]) -> None:
        x, table = self.tensors
        lookup_backward(x, table, self._shared, grad, rows, grads)
