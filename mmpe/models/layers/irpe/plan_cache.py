"""The expansion plan of a grid, built once per process and device.

:func:`get_plan` gives iRPE's plan of a grid, :func:`get_offset_plan` the
cross plan of plain per-axis offsets (ViTDet's decomposed relative
position); both keep their plans in :data:`PLAN_CACHE`.
"""
from typing import Optional

import torch

from ..common.cache import BoundedCache
from .buckets import axis_bucket_tables
from .index import BucketSpec, max_index, relative_offsets_1d
from .plans import CrossPlan, GatherPlan, Plan, ProductPlan

#: Plans of every iRPE module of the process, keyed by (BucketSpec, height,
#: width, device): the 6 encoder layers of a DETR build a grid's plan once.
#: Bounded: a detector sees many grids.
PLAN_CACHE = BoundedCache(32)


def get_plan(spec: BucketSpec,
             height: int,
             width: int,
             device: torch.device,
             side: Optional[int] = None) -> Plan:
    """The cached plan of a grid (spatial tokens only, no skip tokens) for
    the buckets of ``spec``.

    ``side`` (``2b + 1``, the buckets per axis) may be given as a Python
    int: :class:`~mmpe.models.layers.iRPE` passes the one it computed at
    build time, because with ``torch.compile(dynamic=True)`` a module's
    float ``ratio`` is traced as a symbolic value, and sizes derived from it
    would become symbolic too.
    """
    return PLAN_CACHE.get((spec, height, width, device),
                          lambda: _build_plan(spec, height, width, device,
                                              side))


def get_offset_plan(height: int, width: int,
                    device: torch.device) -> CrossPlan:
    """The cached cross plan of plain per-axis offsets (no index function).

    Row id ``iy - jy + height - 1`` in ``[0, 2 height - 1)``, column id
    ``ix - jx + width - 1`` after the ``2 height - 1`` row ids: the
    per-axis lookups of ViTDet's decomposed relative position
    (:mod:`~mmpe.models.layers.decomposed.rel_pos`) expand with it
    exactly as iRPE's cross method expands its buckets.
    """

    def build() -> CrossPlan:
        rows = relative_offsets_1d(height, device) + (height - 1)
        cols = relative_offsets_1d(width, device) + (width - 1)
        return CrossPlan(rows, cols, 2 * height - 1, 2 * width - 1)

    return PLAN_CACHE.get(('offsets', height, width, device), build)


def _build_plan(spec: BucketSpec,
                height: int,
                width: int,
                device: torch.device,
                side: Optional[int] = None) -> Plan:
    if side is None:
        side = 2 * max_index(spec) + 1
    tables = axis_bucket_tables(height, width, spec, device)
    if spec.method in ('product', 'cross'):
        cls = ProductPlan if spec.method == 'product' else CrossPlan
        return cls(tables['rows'], tables['cols'], side)
    return GatherPlan(None, side, (tables, height, width, spec.method, side))
