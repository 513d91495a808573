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

The four parameters that make the buckets travel together as a
:class:`BucketSpec` (hashable: the plan caches key on it).

How the indices of the two axes make the bucket of a pair of grid tokens is
:mod:`~mmpe.models.layers.irpe.buckets`.
"""
import math
from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor

DeviceType = Union[str, torch.device, None]

METHODS = ('euclidean', 'quant', 'cross', 'product')
INDEX_FUNCS = ('piecewise', 'clip')


@dataclass(frozen=True)
class BucketSpec:
    """What makes the buckets of a relative position: the method that
    combines the two axes and the 1-D index function with its parameter.

    Frozen, so hashable (the plan caches key on it) and safe to share.

    Args:
        method (str): One of :data:`METHODS`. Defaults to 'product'.
        index (str): 'piecewise' (Eq. 18) or 'clip'. Defaults to
            'piecewise'.
        ratio (float): Ratio of the piecewise function (see
            :func:`ratio_to_abg`); not read by clip. Defaults to 1.9.
        max_distance (int, optional): ``k`` of the clip function; not read
            by piecewise. Defaults to None.
    """

    method: str = 'product'
    index: str = 'piecewise'
    ratio: float = 1.9
    max_distance: Optional[int] = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f'Unsupported `method` {self.method!r}, please '
                             f'choose from {METHODS}')
        if self.index not in INDEX_FUNCS:
            raise ValueError(f'Unsupported `index` {self.index!r}, please '
                             f'choose from {INDEX_FUNCS}')


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


def max_index(spec: BucketSpec) -> int:
    """Largest index magnitude ``b``: ``floor(2 * ratio)`` or ``max_distance``.

    Args:
        spec (BucketSpec): Its index function and parameter.

    Returns:
        int: ``b``; indices lie in ``[-b, b]``.
    """
    if spec.index == 'piecewise':
        return int(ratio_to_abg(spec.ratio)[1])
    return int(spec.max_distance)


def get_index_func(spec: BucketSpec) -> Callable[[Tensor], Tensor]:
    """The 1D index function ``g`` of ``spec`` (piecewise, Eq. 18, or clip).

    Args:
        spec (BucketSpec): Its index function and parameter.

    Returns:
        Callable[[Tensor], Tensor]: Maps relative distances to long indices.
    """
    if spec.index == 'piecewise':
        alpha, beta, gamma = ratio_to_abg(spec.ratio)
        return lambda x: piecewise_index(x, alpha, beta, gamma)
    return lambda x: clip_index(x, spec.max_distance)


def num_buckets_per_table(spec: BucketSpec, skip: int = 0) -> int:
    """Number of buckets of one encoding table (cross: of one axis).

    Equals the authors' ``get_num_buckets`` plus one when ``skip > 0``.

    Args:
        spec (BucketSpec): Method, index function and parameter.
        skip (int): Number of leading non-spatial tokens.

    Returns:
        int: ``(2b + 1) ** 2`` for product, ``2b + 1`` otherwise, ``+1`` if
        ``skip > 0``.
    """
    side = 2 * max_index(spec) + 1
    n = side * side if spec.method == 'product' else side
    return n + int(skip > 0)


def get_num_buckets(spec: BucketSpec, skip: int = 0) -> int:
    """Total number of buckets, i.e. rows of :attr:`iRPE.table`.

    Cross stacks the row-axis table and then the column-axis table, so its
    count is twice :func:`num_buckets_per_table`.

    Args:
        spec (BucketSpec): Method, index function and parameter.
        skip (int): Number of leading non-spatial tokens.

    Returns:
        int: The number of buckets.
    """
    n = num_buckets_per_table(spec, skip)
    return 2 * n if spec.method == 'cross' else n


def relative_index_1d(size: int,
                      spec: BucketSpec,
                      device: DeviceType = None) -> Tensor:
    """Index of the relative distance along one axis.

    Args:
        size (int): Length of the axis (grid height or width).
        spec (BucketSpec): Its index function and parameter (the method is
            not read).
        device (str | torch.device, optional): Device of the result.

    Returns:
        Tensor: Long tensor (size, size) whose entry ``[p, q]`` is
        ``g(p - q)`` in ``[-b, b]``, ``p`` the query and ``q`` the key
        coordinate.
    """
    func = get_index_func(spec)
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
