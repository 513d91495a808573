"""Decomposed relative position (MViTv2, ViTDet) as a relative term.

MViTv2 (Li et al., "MViTv2: Improved Multiscale Vision Transformers for
Classification and Detection", CVPR 2022, Eq. 4-5) adds to the attention
logit of query ``i = (iy, ix)`` and key ``j = (jy, jx)`` on an ``(h, w)``
token grid

.. math::

    E^{rel}_{ij} = q_i \\cdot R^h_{iy - jy} + q_i \\cdot R^w_{ix - jx}

with one learnable table per axis (``2 S - 1`` rows of ``head_dim``
channels, indexed by the offset, shared by the heads). ViTDet (Li et al.,
"Exploring Plain Vision Transformer Backbones for Object Detection", ECCV
2022) uses it in every block of its plain ViT: window blocks have tables
of ``2 S - 1`` rows for ``S x S`` windows, global blocks of
``2 h0 - 1`` / ``2 w0 - 1`` rows for a fixed grid ``(h0, w0)``
(detectron2's ``input_size``), and a table is resized linearly to
``2 h - 1`` (``2 w - 1``) rows when the grid differs.

Conventions taken from the released code (detectron2
``modeling/backbone/utils.py``, ``add_decomposed_rel_pos`` /
``get_rel_pos``), which this module follows exactly:

* ``q`` is the query **before** the ``1 / sqrt(d)`` scaling of the logits
  (``attn = (q * scale) @ k^T`` then ``attn += q . R``). The term is
  computed here as ``qs . (sqrt(d) R)`` with ``qs = q / sqrt(d)``, the
  logits' scaled queries that the attention core keeps anyway (no second
  copy of ``q`` for the backward); that is the same value (bit for bit when
  ``sqrt(d)`` is a power of two, e.g. ``head_dim`` 64 of ViT-S / ViT-B).
* Resizing is ``F.interpolate(mode='linear', align_corners=False)`` along
  the table's rows (half-pixel centres, source coordinates clamped to the
  table), :func:`resize_rel_pos`; a table of the right length is used as
  it is (the resize is then the identity, exactly).
* ``get_rel_pos`` also scales the coordinates when the query and key
  grids differ (pooled attention in MViTv2); in self-attention they are the
  same grid, so the offset is ``iy - jy + h - 1``, and that scaling is not
  needed here.

The per-axis lookups ``qs @ R^T`` and their expansion to the ``(L, L)``
logits are those of iRPE's cross method (a gather per axis and a broadcast
add, :func:`~mmpe.models.layers.irpe.plan_cache.get_offset_plan`), computed by
the term for the query rows at hand, so every backend of
:class:`~mmpe.models.layers.PEAttention` runs it unchanged. Class tokens
are not supported (ViTDet has none).
"""
import json
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor, nn

from ....utils.arg_checks import check_int, is_int
from ..common.arg_checks import check_choice, check_grid
from ..irpe.plan_cache import get_offset_plan
from ..irpe.plan_ops import Expand
from ..irpe.terms import bucket_lookup, lookup_backward
from ..terms.registry import register_term
from ..terms.relative_term import AxisValues, RelativeTerm, Rows


def resize_rel_pos(table: Tensor, length: int) -> Tensor:
    """Resize a relative-position table linearly along its rows.

    Equal to ``F.interpolate(table.t()[None], size=length, mode='linear',
    align_corners=False)[0].t()`` (ViTDet's ``get_rel_pos``): output row
    ``o`` reads the table at ``max(0, (o + 0.5) T / length - 0.5)``,
    interpolating its two neighbouring rows (the last row past the end).
    Written with a gather so that the graph holds plain ops for any
    (symbolic) ``length`` and no resize operator whose edge cases differ
    between runtimes.

    Args:
        table (Tensor): (T, d).
        length (int): Rows of the result (may be symbolic while tracing).

    Returns:
        Tensor: (length, d), in the dtype of ``table``; ``table`` itself
        (values, not object) when ``length == T``.
    """
    size = table.shape[0]
    dtype = torch.promote_types(table.dtype, torch.float32)
    # (2 o + 1) T / (2 length) - 0.5: exact at o when length == T
    pos = torch.arange(length, device=table.device, dtype=dtype)
    src = ((2 * pos + 1) * size / (2 * length) - 0.5).clamp(min=0)
    low = src.floor().long().clamp(max=size - 1)
    high = (low + 1).clamp(max=size - 1)
    frac = (src - low).to(table.dtype)[:, None]  # (length, 1)
    return table[low] * (1 - frac) + table[high] * frac


@register_term
class DecomposedRelPosTerm(RelativeTerm):
    """The decomposed relative position of one attention call.

    ``T[i, j] = x_i . table[iy - jy + h - 1] + x_i . table[2 h - 1 + ix -
    jx + w - 1]``: the per-query lookup ``x @ table^T`` (B, H, R, 2h-1 +
    2w-1) of the query rows at hand, expanded by the offset plan.

    Args (those of :class:`RelativeTerm`):
        spec (dict): ``{}`` (everything is in the tensors and the grid).
        tensors (list[Tensor]): ``x`` (B, H, L, d), the queries the
            lookup reads, and the table (1, 2h-1 + 2w-1, d): the row-axis
            entries then the column-axis entries, already resized to the
            grid (and, for the attention core, times ``sqrt(d)`` with
            ``x`` the scaled queries, see the module docstring).
        height (int): Grid height.
        width (int): Grid width.
        length (int): Tokens ``height * width``.
    """

    kind = 'rel-pos'

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._plan = None

    @property
    def plan(self):
        """The grid's offset plan, on first use (cached process-wide)."""
        if self._plan is None:
            self._plan = get_offset_plan(self.height, self.width,
                                         self.tensors[0].device)
        return self._plan

    def _term(self, rows: Rows) -> Tensor:
        """(B, H, R, L) for the query rows (None: all)."""
        x, table = self.tensors
        if rows is not None:
            x = x[:, :, rows[0]:rows[1]]
        lookup = bucket_lookup(x, table, True)  # (B, H, R, nb)
        b, h, r, nb = lookup.shape
        term = Expand.apply(lookup.reshape(b * h, r, nb),
                            self.plan.block(rows))
        return term.view(b, h, r, self.length)

    def dense(self) -> Tuple[Tensor, bool]:
        return self._term(None), True

    def add_rows(self, logits: Tensor, rows: Rows) -> Tensor:
        return logits.add_(self._term(rows))

    @property
    def axis_layout(self) -> Optional[str]:
        """Always ``'cross'``: the row-axis then the column-axis lookups."""
        return 'cross'

    def axis_values(self) -> AxisValues:
        x, table = self.tensors
        plan = self.plan
        return AxisValues(bucket_lookup(x, table, True), plan.tables['rows'],
                          plan.tables['cols'], 'cross', plan.side,
                          plan.col_side)

    def backward_rows(self, grad: Tensor, rows: Tuple[int, int],
                      grads: List[Tensor], probs: Optional[Tensor] = None,
                      grad_out: Optional[Tensor] = None) -> None:
        b, h, r, length = grad.shape
        # dL/dlookup of the rows: the per-axis sums of dL/dT
        red = self.plan.block(rows).reduce(grad.reshape(b * h, r, length))
        x, table = self.tensors
        lookup_backward(x, table, True, red.view(b, h, r, -1), rows, grads)


@MODELS.register_module()
class DecomposedRelPos(BaseModule):
    """The per-axis tables of the decomposed relative position.

    Owns ``table_h`` (2 h0 - 1, head_dim) and ``table_w`` (2 w0 - 1,
    head_dim) for the grid ``input_size = (h0, w0)`` (ViTDet's
    ``rel_pos_h`` / ``rel_pos_w``: ``(S, S)`` in a window block, the
    detection input grid in a global block), resizes them to each call's
    grid (:func:`resize_rel_pos`) and builds the call's
    :class:`DecomposedRelPosTerm`. A checkpoint saved for another
    ``input_size`` loads with its tables resized the same way.

    Args:
        head_dim (int): Channels per head (the tables' width).
        input_size (int | tuple[int, int]): The grid ``(h0, w0)`` the tables
            are made for (an int: square).
        init (str): ``'zeros'`` (ViTDet's default, ``rel_pos_zero_init``)
            or ``'trunc_normal'`` (std 0.02, ViTDet's alternative).
            Defaults to 'zeros'.
        init_cfg (dict or list[dict], optional): mmengine init config.
            Defaults to None.
    """

    INITS = ('zeros', 'trunc_normal')

    def __init__(self,
                 head_dim: int,
                 input_size: Union[int, Sequence[int]],
                 init: str = 'zeros',
                 init_cfg: Optional[Union[dict, list]] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        check_int('head_dim', head_dim)
        check_choice('init', init, self.INITS)
        self.input_size = parse_input_size(input_size)
        self.head_dim = head_dim
        self.init = init
        h0, w0 = self.input_size
        self.table_h = nn.Parameter(torch.zeros(2 * h0 - 1, head_dim))
        self.table_w = nn.Parameter(torch.zeros(2 * w0 - 1, head_dim))
        self.reset_tables()
        # a Python float fixed here: a traced forward sees module floats as
        # symbols
        self._sqrt_d = math.sqrt(head_dim)
        self._spec_json = json.dumps({})

    @torch.no_grad()
    def reset_tables(self) -> None:
        """(Re-)initialise the tables according to ``init``."""
        for table in (self.table_h, self.table_w):
            if self.init == 'zeros':
                table.zero_()
            else:
                nn.init.trunc_normal_(table, std=0.02)

    def init_weights(self) -> None:
        """Apply ``init`` then any ``init_cfg`` (mmengine convention)."""
        self.reset_tables()
        super().init_weights()

    def tables(self, height: int, width: int) -> Tuple[Tensor, Tensor]:
        """The tables resized to the grid: (2 h - 1, d) and (2 w - 1, d),
        row ``offset + h - 1`` (``w - 1``) for a query-minus-key offset."""
        return (resize_rel_pos(self.table_h, 2 * height - 1),
                resize_rel_pos(self.table_w, 2 * width - 1))

    def _term(self, x: Tensor, height: int, width: int,
              factor: float) -> DecomposedRelPosTerm:
        r_h, r_w = self.tables(height, width)
        # (1, 2h-1 + 2w-1, d): row-axis then column-axis entries
        table = torch.cat([r_h, r_w]).to(x.dtype)[None]
        if factor != 1.0:
            table = table * factor
        return DecomposedRelPosTerm({}, [x, table], height, width,
                                    height * width, self._spec_json)

    def term(self, qs: Tensor, height: int,
             width: int) -> DecomposedRelPosTerm:
        """The relative term of one attention call.

        Args:
            qs (Tensor): The logits' queries ``q / sqrt(head_dim)``
                (B, H, h * w, head_dim); the term is ``q . R`` of the
                unscaled ``q``, computed as ``qs . (sqrt(head_dim) R)``.
            height (int): Grid height.
            width (int): Grid width.

        Returns:
            DecomposedRelPosTerm: Tensors ``qs`` and the resized tables.
        """
        return self._term(qs, height, width, self._sqrt_d)

    def forward(self, q: Tensor, height: int, width: int) -> Tensor:
        """The whole term for unscaled queries (as ViTDet adds it).

        Args:
            q (Tensor): Queries before scaling (B, H, h * w, head_dim).
            height (int): Grid height.
            width (int): Grid width.

        Returns:
            Tensor: (B, H, h * w, h * w), ``q_i . R_h[iy - jy] + q_i .
            R_w[ix - jx]`` for query ``i`` and key ``j``.
        """
        height, width = check_grid(height, width)
        if q.dim() != 4 or q.shape[2] != height * width or \
                q.shape[3] != self.head_dim:
            raise ValueError(
                f'DecomposedRelPos expects queries (B, H, {height} * '
                f'{width}, {self.head_dim}), got {tuple(q.shape)}')
        return self._term(q, height, width, 1.0).dense()[0]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Resize tables saved for another grid (ViTDet / SAM checkpoints
        of other input sizes) with :func:`resize_rel_pos`."""
        for name in ('table_h', 'table_w'):
            key = prefix + name
            own = getattr(self, name)
            saved = state_dict.get(key)
            if (saved is not None and saved.dim() == 2
                    and saved.shape[1] == own.shape[1]
                    and saved.shape[0] != own.shape[0]):
                state_dict[key] = resize_rel_pos(saved, own.shape[0])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f'input_size={self.input_size}, head_dim={self.head_dim}'


def parse_input_size(input_size: Union[int, Sequence[int]]) -> Tuple[int, int]:
    """``input_size`` as a pair of ints > 0 (an int: square)."""
    pair = input_size
    if is_int(pair):
        pair = (pair, pair)
    if (not isinstance(pair, (list, tuple)) or len(pair) != 2
            or not all(is_int(s, 1) for s in pair)):
        raise ValueError(
            f'Unsupported `input_size` {input_size!r}, please choose an int '
            '> 0 or a pair of them (the grid the tables are made for)')
    return tuple(pair)
