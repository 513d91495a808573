"""The 1-D index functions of image relative position encoding.

Eq. 18 of `Rethinking and Improving Relative Position Encoding for Vision
Transformer <https://arxiv.org/abs/2107.14222>`_ (Wu et al., ICCV 2021) and
the clip function of Shaw et al. map a relative distance along one axis to
an index; the bucket counts of the tables follow. Both follow the authors'
release (``microsoft/Cream``, ``iRPE/irpe.py``) exactly, so their
checkpoints load into :class:`~mmpe.models.layers.iRPE`:

* ``b = floor(beta)`` for the piecewise index and ``b = max_distance`` for
  clip; an index lies in ``[-b, b]`` and is shifted by ``+b`` to a bucket.
* a table has ``(2b + 1) ** 2`` buckets (product) or ``2b + 1`` (the other
  methods; cross: per axis), plus one for the skip tokens when ``skip > 0``.

How the indices of the two axes make the bucket of a pair of grid tokens is
:mod:`~mmpe.models.layers.irpe.buckets`.
"""
import math
from typing import Callable, Optional, Tuple, Union

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
