"""Relative terms of the attention core, evaluated on rows of queries.

:class:`~mmpe.models.layers.PEAttention` computes

.. math::

    e_{ij} = \\tilde q_i \\tilde k_j^T / \\sqrt d + \\sum_t T^t_{ij} + m_{ij},
    \\quad z_i = \\sum_j p_{ij} v_j + \\sum_t \\sum_j p_{ij} r^t_{ij},
    \\quad p_{ij} = \\mathrm{softmax}_j(e_{ij})

where each *relative term* ``t`` adds either to the logits (``T``; iRPE on
queries / keys, Wu et al. 2021 Eq. 16; ViTDet's decomposed relative
position, Li et al. 2022) or, weighted by the probabilities, to the output
(``r``; iRPE on values, Eq. 17). Every backend of the core
(``explicit``, ``sdpa``, ``chunked``) sees a term only through the interface
below, so a new term needs no change to any backend:

* :attr:`RelativeTerm.tensors`: the term's differentiable inputs, e.g. the
  scaled queries and a table (from which the term computes its per-query
  lookups ``x @ table^T`` for the rows at hand), small per-query lookups
  (``(B, H, L, K)``) or tables. The chunked backend saves them for its
  backward and returns their gradients; the rest of the graph (how they
  came from ``q``, ``k`` and the parameters) is ordinary autograd.
* logit terms: :meth:`RelativeTerm.add_rows` adds ``T[rows, :]`` into a
  ``(B, H, R, L)`` block of logits, and :meth:`RelativeTerm.backward_rows`
  its adjoint: given ``dL/dT[rows, :]`` it accumulates the gradients of
  :attr:`tensors`. :meth:`RelativeTerm.dense` is ``T`` as one tensor (the
  constant float mask of ``F.scaled_dot_product_attention``).
* value terms: :meth:`RelativeTerm.out_rows` (``sum_j p_ij r_ij`` of the
  rows), :meth:`RelativeTerm.begin_backward` (per-call work on the output
  gradient) and :meth:`RelativeTerm.backward_rows` (adds
  ``dL/dz_i . r_ij`` into the probabilities' gradient and accumulates the
  gradients of :attr:`tensors`); :meth:`RelativeTerm.end_backward` after
  the last range.

``rows`` is ``(start, stop)``, a range of query tokens, or None for all of
them; with None the methods must be differentiable by autograd (the
explicit backend runs them on all rows inside the autograd graph), with a
range they run under ``torch.no_grad()`` inside the chunked backend.

A term is described by a JSON-able :meth:`RelativeTerm.spec`, from which
:mod:`~mmpe.models.layers.terms.registry` rebuilds it by its ``kind``.
"""
import json
from typing import List, NamedTuple, Optional, Sequence, Tuple

from torch import Tensor

Rows = Optional[Tuple[int, int]]


class AxisValues(NamedTuple):
    """A logit term as per-query values over per-axis buckets.

    For the query ``i = (iy, ix)`` and the key ``j = (jy, jx)`` of the grid,
    with ``u = rows[iy, jy]`` and ``v = cols[ix, jx]``, the bucket of the
    pair is ``b(i, j) = u * col_buckets + v`` (``'product'``) or the two
    buckets ``u`` and ``col_offset + v`` (``'cross'``, whose values are
    summed); a pair with one of the ``skip`` leading tokens (class tokens)
    has the bucket(s) ``extras``. With ``on='k'`` the term is ``T[i, j] =
    values[i, b(i, j)]``, with ``on='q'`` it is ``values[j, b(j, i)]`` (seen
    from the key, as iRPE on queries), and with ``on='v'`` the output gets
    ``sum_j p_ij values[b(i, j)]`` (iRPE on values, Eq. 17). The form the
    fused CPU kernel (:mod:`~mmpe.models.layers.attention.fused`) reads.

    Attributes:
        values (Tensor): ``on`` 'k' / 'q': per-token values broadcastable
            to (B, H, L, buckets); 'v': the table (H', buckets, d). In the
            attention's dtype; differentiable (its gradient flows on to the
            term's tensors through autograd).
        rows (Tensor): (h, h) long, row-axis bucket of each (iy, jy).
        cols (Tensor): (w, w) long, column-axis bucket of each (ix, jx).
        layout (str): ``'product'`` or ``'cross'``.
        row_buckets (int): ``Sy``.
        col_buckets (int): ``Sx``.
        col_offset (int, optional): Cross: where the column buckets start;
            None: ``row_buckets``.
        skip (int): Leading tokens outside the grid.
        extras (tuple[int, ...]): Their bucket(s): one (product) or one per
            axis (cross).
        on (str): ``'k'``, ``'q'`` or ``'v'`` (above).
        query_grid (bool): Whether the queries are the grid's tokens (a
            self-attention). False: ``Q`` queries off the grid (a decoder's
            cross-attention against an ``(h, w)`` key grid, e.g. BoxRPB),
            each seeing the keys from the grid's origin: ``u = rows[0,
            jy]``, ``v = cols[0, jx]``; only a term on keys, no skip
            tokens (the Triton kernel takes it, the CPU kernel does not).
    """

    values: Tensor
    rows: Tensor
    cols: Tensor
    layout: str
    row_buckets: int
    col_buckets: int
    col_offset: Optional[int] = None
    skip: int = 0
    extras: Tuple[int, ...] = ()
    on: str = 'k'
    query_grid: bool = True


class RelativeTerm:
    """One relative term of one attention call (see the module docstring).

    Subclasses set :attr:`kind` and :attr:`target` and implement the
    methods of their target; instances hold the call's tensors and grid.

    Args:
        spec (dict): JSON-able configuration (:meth:`spec`).
        tensors (list[Tensor]): The differentiable inputs.
        height (int): Grid height.
        width (int): Grid width.
        length (int): Tokens ``L`` (skip tokens included).
    """

    #: registry name
    kind: str = ''
    #: ``'logits'`` or ``'values'``
    target: str = 'logits'

    def __init__(self,
                 spec: dict,
                 tensors: Sequence[Tensor],
                 height: int,
                 width: int,
                 length: int,
                 spec_json: Optional[str] = None) -> None:
        self._spec = spec
        self._spec_json = spec_json
        self.tensors: List[Tensor] = list(tensors)
        self.height, self.width, self.length = height, width, length

    def spec(self) -> dict:
        """The configuration :func:`~.registry.build_terms` rebuilds the term
        from."""
        return self._spec

    def spec_json(self) -> str:
        """:meth:`spec` as JSON; modules pass it in precomputed, because a
        traced forward cannot run ``json.dumps``."""
        if self._spec_json is None:
            self._spec_json = json.dumps(self._spec, sort_keys=True)
        return self._spec_json

    # -- logit terms -----------------------------------------------------
    def add_rows(self, logits: Tensor, rows: Rows) -> Tensor:
        """Add ``T[rows, :]`` to ``logits`` (B, H, R, L), in place where
        possible; returns the result."""
        raise NotImplementedError

    def dense(self) -> Tuple[Tensor, bool]:
        """``T`` broadcastable to (B, H, L, L), and whether it is a fresh
        buffer of this call (which its consumer may add into)."""
        raise NotImplementedError

    @property
    def axis_layout(self) -> Optional[str]:
        """``'product'`` / ``'cross'`` when :meth:`axis_values` describes the
        term (cheap to ask; it computes nothing), else None."""
        return None

    @property
    def axis_on(self) -> str:
        """:attr:`AxisValues.on` of :meth:`axis_values` (cheap to ask)."""
        return 'k'

    @property
    def axis_query_grid(self) -> bool:
        """:attr:`AxisValues.query_grid` of :meth:`axis_values` (cheap to
        ask): False where the queries are not the grid's tokens."""
        return True

    @property
    def axis_shared(self) -> bool:
        """Whether :meth:`axis_values` gives values shared by every viewer
        and image (a per-head table ``(1, H, 1, nb)``: a bias table, the
        offset biases), not per token (cheap to ask); the ``'auto'`` rule
        reads it (``backend_rule.AttentionCall.shared_terms``)."""
        return False

    def axis_values(self) -> AxisValues:
        """The term as :class:`AxisValues` (only where :attr:`axis_layout`
        is not None), for the fused kernels (CPU, Triton)."""
        raise NotImplementedError

    # -- value terms -----------------------------------------------------
    def out_rows(self, probs: Tensor, rows: Rows) -> Tensor:
        """``sum_j p_ij r_ij`` for the rows: (B, H, R, L) -> (B, H, R, d).
        """
        raise NotImplementedError

    def begin_backward(self, grad_out: Tensor) -> None:
        """Work on the whole output gradient (B, H, L, d) before the rows'
        backward (value terms)."""

    # -- both --------------------------------------------------------------
    def end_backward(self, grads: List[Tensor]) -> None:
        """Work after the last range of rows (e.g. gradients accumulated
        over the ranges taken through to :attr:`tensors`)."""

    def backward_rows(self, grad: Tensor, rows: Tuple[int, int],
                      grads: List[Tensor], probs: Optional[Tensor] = None,
                      grad_out: Optional[Tensor] = None) -> None:
        """The adjoint on a range of rows, accumulated into ``grads``.

        Args:
            grad (Tensor): Logit terms: ``dL/de`` of the rows (B, H, R, L).
                Value terms: ``dL/dp`` of the rows (B, H, R, L), into
                which the term adds its part in place.
            rows (tuple[int, int]): The query rows.
            grads (list[Tensor]): Gradients of :attr:`tensors`, zeros at
                the first range; this method adds to them.
            probs (Tensor, optional): Value terms: the probabilities of the
                rows (B, H, R, L).
            grad_out (Tensor, optional): Value terms: ``dL/dz`` of the rows
                (B, H, R, d).
        """
        raise NotImplementedError


def split_terms(
    terms: Sequence[RelativeTerm]
) -> Tuple[List[RelativeTerm], List[RelativeTerm]]:
    """(logit terms, value terms) in their order."""
    return ([t for t in terms if t.target == 'logits'],
            [t for t in terms if t.target == 'values'])

