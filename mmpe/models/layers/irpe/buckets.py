"""Bucket ids of image relative position encoding on a 2-D token grid.

Eq. 19-25 of `Rethinking and Improving Relative Position Encoding for Vision
Transformer <https://arxiv.org/abs/2107.14222>`_ (Wu et al., ICCV 2021),
built from the 1-D index functions of :mod:`~mmpe.models.layers.irpe.index`
as in the authors' release (``microsoft/Cream``, ``iRPE/irpe.py``):

* Tokens lie on an ``height x width`` grid in row-major order, after ``skip``
  leading tokens (class / distillation tokens). The relative position of a
  query ``i`` and a key ``j`` is ``(dy, dx) = pos(i) - pos(j)`` (query minus
  key, rows first); ``b`` is the largest index
  (:func:`~mmpe.models.layers.irpe.index.max_index`).
* product: ``(index(dy) + b) * (2b + 1) + (index(dx) + b)`` - the row part is
  the major digit; ``(2b + 1) ** 2`` buckets.
* euclidean: ``index(round(sqrt(dy^2 + dx^2))) + b``; quant:
  ``index(dy^2 + dx^2) + b``. ``2b + 1`` buckets, of which only ``[b, 2b]``
  are reachable (the authors keep the unused lower half, and so do we).
* cross: two id maps, ``index(dy) + b`` for the row axis and
  ``index(dx) + b`` for the column axis, each with its own table of
  ``2b + 1`` buckets; their encodings are summed (Eq. 22).
* ``skip > 0``: one extra bucket, the last id ``num_buckets - 1`` of a table
  (cross: of each axis' table), for every pair involving a skip token.

All ids are built from small per-axis 1D tables (``height x height`` and
``width x width``; euclidean / quant use one ``height x width`` table of
distances) that are broadcast together with integer arithmetic, never from
``L x L`` floating-point work.
"""
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from .index import (BucketSpec, DeviceType, get_index_func, max_index,
                    num_buckets_per_table, relative_index_1d,
                    relative_offsets_1d)


def _abs_diff(size: int, device: DeviceType) -> Tensor:
    """Long tensor (size, size) with entry ``[p, q] = |p - q|``."""
    return relative_offsets_1d(size, device).abs()


def _distance_index_2d(height: int, width: int, spec: BucketSpec,
                       device: DeviceType) -> Tensor:
    """Index of the undirected distance for ``|dy| < height, |dx| < width``
    (``spec.method`` euclidean or quant).

    Returns:
        Tensor: Long tensor (height, width), entry ``[|dy|, |dx|]``.
    """
    func = get_index_func(spec)
    ady = torch.arange(height, device=device)[:, None]
    adx = torch.arange(width, device=device)[None, :]
    sq = ady * ady + adx * adx  # (height, width), exact integers
    if spec.method == 'euclidean':
        # float32 sqrt then round, as the authors' release
        return func(sq.to(torch.float32).sqrt().round())
    return func(sq)  # quant: the squared distance itself


def _pad_skip(ids: Tensor, skip: int, extra: int) -> Tensor:
    """Prepend ``skip`` rows and columns holding the ``extra`` bucket.

    Args:
        ids (Tensor): Long tensor (..., L0, L0).
        skip (int): Number of leading skip tokens.
        extra (int or Tensor): The extra bucket id(s), broadcast over the
            leading dims of ``ids``.

    Returns:
        Tensor: Long tensor (..., skip + L0, skip + L0).
    """
    if skip == 0:
        return ids
    *lead, l0, _ = ids.shape
    length = skip + l0
    out = ids.new_empty(*lead, length, length)
    if not isinstance(extra, Tensor):
        extra = torch.tensor(extra, device=ids.device)
    extra = extra.view(*extra.shape, 1, 1)
    out[..., :skip, :] = extra
    out[..., :, :skip] = extra
    out[..., skip:, skip:] = ids
    return out


def axis_bucket_tables(height: int,
                       width: int,
                       spec: BucketSpec = BucketSpec(),
                       device: DeviceType = None) -> Dict[str, Tensor]:
    """The small per-axis bucket tables every 2D id is made of.

    The one place that evaluates the index function on a grid: the bucket
    ids of :func:`get_bucket_ids_2d`, the expansion plans of
    :mod:`~mmpe.models.layers.irpe.plans` and the FlexAttention
    ``score_mod`` all combine these tables.

    Args:
        height (int): Grid height.
        width (int): Grid width.
        spec (BucketSpec): Method, index function and parameter.
            Defaults to ``BucketSpec()`` (product, piecewise, 1.9).
        device (str | torch.device, optional): Device of the result.

    Returns:
        dict[str, Tensor]: Long tensors, already shifted by ``+b`` into
        ``[0, 2b + 1)``. product / cross: ``rows`` (height, height) with
        entry ``[iy, jy] = g(iy - jy) + b`` and ``cols`` (width, width);
        euclidean / quant: ``dist`` (height, width) with entry
        ``[|dy|, |dx|]``, the bucket of the undirected distance.
    """
    b = max_index(spec)
    if spec.method in ('euclidean', 'quant'):
        return dict(dist=_distance_index_2d(height, width, spec, device) + b)
    return dict(rows=relative_index_1d(height, spec, device) + b,
                cols=relative_index_1d(width, spec, device) + b)


def _covering_rows(span: Optional[Tuple[int, int]], height: int,
                   width: int, device: DeviceType):
    """Grid rows covering a range of row-major spatial indices.

    Returns:
        tuple: ``(rows, offset, size)``: the covering grid rows (long, or
        None for the whole grid), the position of the range's start in
        them and the range's length (None for the whole grid).
    """
    if span is None:
        return None, 0, None
    start, stop = span
    first, last = start // width, -(-stop // width)
    return (torch.arange(first, last, device=device), start - first * width,
            stop - start)


def spatial_bucket_ids(tables: Dict[str, Tensor],
                       height: int,
                       width: int,
                       method: str,
                       side: int,
                       rows: Optional[Tuple[int, int]] = None,
                       cols: Optional[Tuple[int, int]] = None,
                       col_offset: int = 0) -> Tensor:
    """Bucket ids of a block of spatial (query, key) pairs (no skip tokens).

    The block is queries ``[r0, r1)`` x keys ``[c0, c1)`` of the
    ``(L0, L0)`` map, ``L0 = height * width``, in row-major token order. It
    is built from the per-axis ``tables`` of :func:`axis_bucket_tables` over
    the grid rows covering each range (4D broadcasting, as for the whole
    map), then narrowed to the range, so a block of ``R`` queries costs
    about ``R + 2 width`` rows of ids, never the ``(L0, L0)`` map.

    Args:
        tables (dict[str, Tensor]): :func:`axis_bucket_tables` of the grid.
        height (int): Grid height.
        width (int): Grid width.
        method (str): One of :data:`~mmpe.models.layers.irpe.index.METHODS`.
        side (int): Buckets per axis, ``2b + 1``.
        rows (tuple[int, int], optional): Query range; None: all.
        cols (tuple[int, int], optional): Key range; None: all.
        col_offset (int): Added to the column-axis ids of cross.

    Returns:
        Tensor: Long ``(R, C)``; cross ``(2, R, C)`` (row-axis ids, then the
        column-axis ids plus ``col_offset``).
    """
    device = next(iter(tables.values())).device
    ys_r, off_r, n_r = _covering_rows(rows, height, width, device)
    ys_c, off_c, n_c = _covering_rows(cols, height, width, device)
    if method in ('euclidean', 'quant'):
        if ys_r is None and ys_c is None:
            ady = _abs_diff(height, device)
        else:
            yr = torch.arange(height, device=device) if ys_r is None else ys_r
            yc = torch.arange(height, device=device) if ys_c is None else ys_c
            ady = (yr[:, None] - yc[None, :]).abs()  # (rows, cols) of grid
        adx = _abs_diff(width, device)
        # (qy, ky) and (qx, kx) broadcast to (qy, qx, ky, kx)
        ids = tables['dist'][ady[:, None, :, None], adx[None, :, None, :]]
        lead = ()
    else:
        row_t = tables['rows']
        if ys_r is not None:
            row_t = row_t[ys_r]
        if ys_c is not None:
            row_t = row_t[:, ys_c]
        r4 = row_t[:, None, :, None]  # (qy, 1, ky, 1)
        c4 = tables['cols'][None, :, None, :]  # (1, qx, 1, kx)
        if method == 'product':
            ids = r4 * side + c4
            lead = ()
        else:  # cross: the two axes' ids, stacked
            shape = (r4.shape[0], width, r4.shape[2], width)
            ids = torch.stack(
                [r4.expand(shape), c4.expand(shape) + col_offset])
            lead = (2, )
    qy, ky = ids.shape[len(lead)], ids.shape[len(lead) + 2]
    ids = ids.reshape(*lead, qy * width, ky * width)
    if n_r is not None:
        ids = ids.narrow(-2, off_r, n_r)
    if n_c is not None:
        ids = ids.narrow(-1, off_c, n_c)
    return ids


def get_bucket_ids_2d(height: int,
                      width: int,
                      spec: BucketSpec = BucketSpec(),
                      skip: int = 0,
                      device: DeviceType = None) -> Tensor:
    """Bucket id of every (query, key) token pair, Eq. 19-25 of the paper.

    See the module docstring for the conventions (relative position is query
    minus key, product ``(dy + b) * (2b + 1) + (dx + b)``, the extra skip
    bucket is the last one).

    Args:
        height (int): Grid height.
        width (int): Grid width.
        spec (BucketSpec): Method, index function and parameter.
            Defaults to ``BucketSpec()`` (product, piecewise, 1.9).
        skip (int): Number of leading non-spatial tokens.
        device (str | torch.device, optional): Device of the result.

    Returns:
        Tensor: Long tensor (L, L) with ``L = skip + height * width``, entry
        ``[i, j]`` for query ``i`` and key ``j``; for cross (2, L, L), the
        row-axis ids in ``[0, n)`` and the column-axis ids in ``[n, 2n)``
        with ``n = num_buckets_per_table(spec, skip)``, i.e. both index the
        stacked table of :func:`get_num_buckets` rows.
    """
    tables = axis_bucket_tables(height, width, spec, device)
    side = 2 * max_index(spec) + 1
    per_table = num_buckets_per_table(spec, skip)
    ids = spatial_bucket_ids(tables, height, width, spec.method, side,
                             col_offset=per_table)
    if spec.method != 'cross':
        return _pad_skip(ids, skip, per_table - 1)
    extra = torch.tensor([per_table - 1, 2 * per_table - 1], device=device)
    return _pad_skip(ids, skip, extra)
