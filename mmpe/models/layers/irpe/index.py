"""Index functions and 2D bucket ids of image relative position encoding.

Pure, framework-free tensor functions implementing Eq. 18-25 of
`Rethinking and Improving Relative Position Encoding for Vision Transformer
<https://arxiv.org/abs/2107.14222>`_ (Wu et al., ICCV 2021). Bucket counts and
bucket ids follow the authors' release (``microsoft/Cream``, ``iRPE/irpe.py``)
exactly, so their checkpoints load into :class:`~mmpe.models.layers.iRPE`:

* Tokens lie on an ``height x width`` grid in row-major order, after ``skip``
  leading tokens (class / distillation tokens). The relative position of a
  query ``i`` and a key ``j`` is ``(dy, dx) = pos(i) - pos(j)`` (query minus
  key, rows first).
* ``b = floor(beta)`` for the piecewise index and ``b = max_distance`` for
  clip; an index lies in ``[-b, b]`` and is shifted by ``+b`` to a bucket.
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
import math
from typing import Callable, Dict, Optional, Tuple, Union

import torch
from torch import Tensor

DeviceType = Union[str, torch.device, None]

METHODS = ('euclidean', 'quant', 'cross', 'product')
INDEX_FUNCS = ('piecewise', 'clip')


def ratio_to_abg(ratio: float) -> Tuple[float, float, float]:
    """Coefficients of the piecewise index function from a ratio.

    The paper fixes ``alpha : beta : gamma = 1 : 2 : 8`` (Sec. 4.1).

    Args:
        ratio (float): ``alpha``; 1.9 gives 7 buckets per axis, 2.0 gives 9.

    Returns:
        tuple[float, float, float]: ``(alpha, beta, gamma) = (r, 2r, 8r)``.
    """
    return 1.0 * ratio, 2.0 * ratio, 8.0 * ratio


def piecewise_index(x: Tensor, alpha: float, beta: float,
                    gamma: float) -> Tensor:
    """Piecewise index function, Eq. 18 of the iRPE paper.

    ``g(x) = round(x)`` if ``|x| <= alpha``, otherwise
    ``sign(x) * min(beta, round(alpha + ln(|x| / alpha) / ln(gamma / alpha) *
    (beta - alpha)))``, truncated to an integer, so the result lies in
    ``[-floor(beta), floor(beta)]``. It is odd and monotone non-decreasing.

    Integer inputs are evaluated in float32 like the authors' release, so that
    rounding ties (e.g. ``ratio=1.5, x=6``) break the same way; float inputs
    are evaluated in their own dtype. ``round`` is round-half-to-even.

    Args:
        x (Tensor): Relative distances of any shape, integer or float.
        alpha (float): Half width of the exact (identity) range, > 0.
        beta (float): Largest index magnitude, > alpha.
        gamma (float): Distance at which the index saturates, > alpha.

    Returns:
        Tensor: Long tensor of the shape of ``x``.
    """
    if not x.is_floating_point():
        x = x.to(torch.float32)
    x_abs = x.abs()
    # clamp keeps log() finite on the entries the where() below discards
    far = alpha + torch.log(x_abs.clamp(min=alpha) / alpha) / math.log(
        gamma / alpha) * (beta - alpha)
    far = torch.sign(x) * far.round().clamp(max=beta)
    # .long() truncates toward zero: min(beta, .) with a fractional beta
    # becomes floor(beta)
    return torch.where(x_abs <= alpha, x.round(), far).long()


def clip_index(x: Tensor, max_distance: int) -> Tensor:
    """Clip index function of Shaw et al., ``clamp(x, -k, k)``.

    Args:
        x (Tensor): Relative distances of any shape, integer or float (float
            values are rounded first).
        max_distance (int): ``k``, the largest index magnitude.

    Returns:
        Tensor: Long tensor of the shape of ``x`` with values in ``[-k, k]``.
    """
    if x.is_floating_point():
        x = x.round()
    return x.long().clamp(-max_distance, max_distance)


def max_index(index: str = 'piecewise',
              ratio: float = 1.9,
              max_distance: Optional[int] = None) -> int:
    """Largest index magnitude ``b``: ``floor(2 * ratio)`` or ``max_distance``.

    Args:
        index (str): 'piecewise' or 'clip'.
        ratio (float): Ratio of the piecewise function (see
            :func:`ratio_to_abg`). Ignored for clip.
        max_distance (int, optional): ``k`` of the clip function.

    Returns:
        int: ``b``; indices lie in ``[-b, b]``.
    """
    if index == 'piecewise':
        return int(ratio_to_abg(ratio)[1])
    if index == 'clip':
        return int(max_distance)
    raise ValueError(f'Unsupported `index` {index!r}, please choose from '
                     f'{INDEX_FUNCS}')


def get_index_func(
        index: str = 'piecewise',
        ratio: float = 1.9,
        max_distance: Optional[int] = None) -> Callable[[Tensor], Tensor]:
    """The 1D index function ``g`` selected by ``index``.

    Args:
        index (str): 'piecewise' (Eq. 18) or 'clip'.
        ratio (float): Ratio of the piecewise function.
        max_distance (int, optional): ``k`` of the clip function.

    Returns:
        Callable[[Tensor], Tensor]: Maps relative distances to long indices.
    """
    if index == 'piecewise':
        alpha, beta, gamma = ratio_to_abg(ratio)
        return lambda x: piecewise_index(x, alpha, beta, gamma)
    if index == 'clip':
        return lambda x: clip_index(x, max_distance)
    raise ValueError(f'Unsupported `index` {index!r}, please choose from '
                     f'{INDEX_FUNCS}')


def num_buckets_per_table(method: str,
                          index: str = 'piecewise',
                          ratio: float = 1.9,
                          max_distance: Optional[int] = None,
                          skip: int = 0) -> int:
    """Number of buckets of one encoding table (cross: of one axis).

    Equals the authors' ``get_num_buckets`` plus one when ``skip > 0``.

    Args:
        method (str): One of :data:`METHODS`.
        index (str): 'piecewise' or 'clip'.
        ratio (float): Ratio of the piecewise function.
        max_distance (int, optional): ``k`` of the clip function.
        skip (int): Number of leading non-spatial tokens.

    Returns:
        int: ``(2b + 1) ** 2`` for product, ``2b + 1`` otherwise, ``+1`` if
        ``skip > 0``.
    """
    if method not in METHODS:
        raise ValueError(f'Unsupported `method` {method!r}, please choose '
                         f'from {METHODS}')
    side = 2 * max_index(index, ratio, max_distance) + 1
    n = side * side if method == 'product' else side
    return n + int(skip > 0)


def get_num_buckets(method: str,
                    index: str = 'piecewise',
                    ratio: float = 1.9,
                    max_distance: Optional[int] = None,
                    skip: int = 0) -> int:
    """Total number of buckets, i.e. rows of :attr:`iRPE.table`.

    Cross stacks the row-axis table and then the column-axis table, so its
    count is twice :func:`num_buckets_per_table`.

    Args:
        method (str): One of :data:`METHODS`.
        index (str): 'piecewise' or 'clip'.
        ratio (float): Ratio of the piecewise function.
        max_distance (int, optional): ``k`` of the clip function.
        skip (int): Number of leading non-spatial tokens.

    Returns:
        int: The number of buckets.
    """
    n = num_buckets_per_table(method, index, ratio, max_distance, skip)
    return 2 * n if method == 'cross' else n


def relative_index_1d(size: int,
                      index: str = 'piecewise',
                      ratio: float = 1.9,
                      max_distance: Optional[int] = None,
                      device: DeviceType = None) -> Tensor:
    """Index of the relative distance along one axis.

    Args:
        size (int): Length of the axis (grid height or width).
        index (str): 'piecewise' or 'clip'.
        ratio (float): Ratio of the piecewise function.
        max_distance (int, optional): ``k`` of the clip function.
        device (str | torch.device, optional): Device of the result.

    Returns:
        Tensor: Long tensor (size, size) whose entry ``[p, q]`` is
        ``g(p - q)`` in ``[-b, b]``, ``p`` the query and ``q`` the key
        coordinate.
    """
    func = get_index_func(index, ratio, max_distance)
    # g depends on p - q only: evaluate it on the 2 * size - 1 distances
    dist = torch.arange(-(size - 1), size, device=device)
    table = func(dist)
    return table[relative_offsets_1d(size, device) + size - 1]


def relative_offsets_1d(size: int, device: DeviceType = None) -> Tensor:
    """Relative positions along one axis, the one place they are made.

    Args:
        size (int): Length of the axis (may be symbolic while tracing).
        device (str | torch.device, optional): Device of the result.

    Returns:
        Tensor: Long (size, size), entry ``[p, q] = p - q`` in
        ``[-(size - 1), size - 1]`` (``p`` the query, ``q`` the key
        coordinate).
    """
    pos = torch.arange(size, device=device)
    return pos[:, None] - pos[None, :]


def _abs_diff(size: int, device: DeviceType) -> Tensor:
    """Long tensor (size, size) with entry ``[p, q] = |p - q|``."""
    return relative_offsets_1d(size, device).abs()


def _distance_index_2d(height: int, width: int, method: str, index: str,
                       ratio: float, max_distance: Optional[int],
                       device: DeviceType) -> Tensor:
    """Index of the undirected distance for ``|dy| < height, |dx| < width``.

    Returns:
        Tensor: Long tensor (height, width), entry ``[|dy|, |dx|]``.
    """
    func = get_index_func(index, ratio, max_distance)
    ady = torch.arange(height, device=device)[:, None]
    adx = torch.arange(width, device=device)[None, :]
    sq = ady * ady + adx * adx  # (height, width), exact integers
    if method == 'euclidean':
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
                       method: str = 'product',
                       index: str = 'piecewise',
                       ratio: float = 1.9,
                       max_distance: Optional[int] = None,
                       device: DeviceType = None) -> Dict[str, Tensor]:
    """The small per-axis bucket tables every 2D id is made of.

    The one place that evaluates the index function on a grid: the bucket
    ids of :func:`get_bucket_ids_2d`, the expansion plans of
    :mod:`~mmpe.models.layers.irpe.plans` and the FlexAttention
    ``score_mod`` all combine these tables.

    Args:
        height (int): Grid height.
        width (int): Grid width.
        method (str): One of :data:`METHODS`.
        index (str): 'piecewise' or 'clip'.
        ratio (float): Ratio of the piecewise function.
        max_distance (int, optional): ``k`` of the clip function.
        device (str | torch.device, optional): Device of the result.

    Returns:
        dict[str, Tensor]: Long tensors, already shifted by ``+b`` into
        ``[0, 2b + 1)``. product / cross: ``rows`` (height, height) with
        entry ``[iy, jy] = g(iy - jy) + b`` and ``cols`` (width, width);
        euclidean / quant: ``dist`` (height, width) with entry
        ``[|dy|, |dx|]``, the bucket of the undirected distance.
    """
    if method not in METHODS:
        raise ValueError(f'Unsupported `method` {method!r}, please choose '
                         f'from {METHODS}')
    b = max_index(index, ratio, max_distance)
    if method in ('euclidean', 'quant'):
        return dict(dist=_distance_index_2d(height, width, method, index,
                                            ratio, max_distance, device) + b)
    return dict(
        rows=relative_index_1d(height, index, ratio, max_distance, device) +
        b,
        cols=relative_index_1d(width, index, ratio, max_distance, device) +
        b)


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
        method (str): One of :data:`METHODS`.
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
            ids = torch.stack([r4.expand(shape), c4.expand(shape) + col_offset])
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
                      method: str = 'product',
                      index: str = 'piecewise',
                      ratio: float = 1.9,
                      max_distance: Optional[int] = None,
                      skip: int = 0,
                      device: DeviceType = None) -> Tensor:
    """Bucket id of every (query, key) token pair, Eq. 19-25 of the paper.

    See the module docstring for the conventions (relative position is query
    minus key, product ``(dy + b) * (2b + 1) + (dx + b)``, the extra skip
    bucket is the last one).

    Args:
        height (int): Grid height.
        width (int): Grid width.
        method (str): One of :data:`METHODS`.
        index (str): 'piecewise' or 'clip'.
        ratio (float): Ratio of the piecewise function.
        max_distance (int, optional): ``k`` of the clip function.
        skip (int): Number of leading non-spatial tokens.
        device (str | torch.device, optional): Device of the result.

    Returns:
        Tensor: Long tensor (L, L) with ``L = skip + height * width``, entry
        ``[i, j]`` for query ``i`` and key ``j``; for cross (2, L, L), the
        row-axis ids in ``[0, n)`` and the column-axis ids in ``[n, 2n)``
        with ``n = num_buckets_per_table(...)``, i.e. both index the stacked
        table of :func:`get_num_buckets` rows.
    """
    tables = axis_bucket_tables(height, width, method, index, ratio,
                                max_distance, device)
    side = 2 * max_index(index, ratio, max_distance) + 1
    per_table = num_buckets_per_table(method, index, ratio, max_distance, skip)
    ids = spatial_bucket_ids(tables, height, width, method, side,
                             col_offset=per_table)
    if method != 'cross':
        return _pad_skip(ids, skip, per_table - 1)
    extra = torch.tensor([per_table - 1, 2 * per_table - 1], device=device)
    return _pad_skip(ids, skip, extra)
