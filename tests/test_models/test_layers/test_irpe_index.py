"""Tests of the iRPE index functions and 2D bucket ids against slow loops."""
import math
from functools import lru_cache
from typing import Optional, Tuple, Union

import pytest
import torch

from mmpe.models.layers.irpe.buckets import (axis_bucket_tables,
                                             get_bucket_ids_2d,
                                             spatial_bucket_ids)
from mmpe.models.layers.irpe.index import (METHODS, BucketSpec, clip_index,
                                           get_num_buckets, max_index,
                                           num_buckets_per_table,
                                           piecewise_index, ratio_to_abg,
                                           relative_index_1d)

# Ratios whose Eq. 18 values have no rounding ties on the tested distances,
# so the float64 reference below and the float32 implementation (as the
# authors') agree exactly; e.g. ratio 1.5 has an exact tie at x = 6.
RATIOS = (0.5, 1.0, 1.9, 2.0, 2.5, 3.0, 4.2)


def ref_piecewise(x: float, alpha: float, beta: float, gamma: float) -> int:
    """Eq. 18 of the iRPE paper, scalar, in Python floats."""
    if abs(x) <= alpha:
        return int(round(x))
    y = alpha + math.log(abs(x) / alpha) / math.log(
        gamma / alpha) * (beta - alpha)
    # sign * min(beta, round(y)), then truncated to an integer
    return int(math.copysign(min(beta, round(y)), x))


def ref_index(x: float, index: str, ratio: float, k: Optional[int]) -> int:
    if index == 'clip':
        return max(-k, min(k, int(round(x))))
    return ref_piecewise(x, *ratio_to_abg(ratio))


@lru_cache(maxsize=None)
def ref_bucket(method: str, index: str, ratio: float, k: Optional[int],
               dy: int, dx: int) -> Union[int, Tuple[int, int]]:
    """Bucket of a spatial pair with relative position (dy, dx), no skip."""
    b = int(2 * ratio) if index == 'piecewise' else k
    side = 2 * b + 1
    g = lambda v: ref_index(v, index, ratio, k)  # noqa: E731
    if method == 'product':
        return (g(dy) + b) * side + g(dx) + b
    if method == 'euclidean':
        return g(round(math.sqrt(dy * dy + dx * dx))) + b
    if method == 'quant':
        return g(dy * dy + dx * dx) + b
    return g(dy) + b, g(dx) + b  # cross, column id not yet offset


def ref_bucket_ids(height: int, width: int, method: str, index: str,
                   ratio: float, k: Optional[int], skip: int) -> torch.Tensor:
    """Loop over every (query, key) token pair."""
    per = num_buckets_per_table(BucketSpec(method, index, ratio, k), skip)
    length = skip + height * width
    rows, cols = [], []  # cross: row-axis and column-axis ids
    for i in range(length):
        row, col = [], []
        for j in range(length):
            if i < skip or j < skip:  # the extra bucket of each table
                row.append(per - 1)
                col.append(2 * per - 1)
                continue
            qi, kj = i - skip, j - skip
            dy = qi // width - kj // width  # query minus key, rows first
            dx = qi % width - kj % width
            bucket = ref_bucket(method, index, ratio, k, dy, dx)
            if method == 'cross':
                row.append(bucket[0])
                col.append(bucket[1] + per)
            else:
                row.append(bucket)
        rows.append(row)
        cols.append(col)
    if method == 'cross':
        return torch.tensor([rows, cols])
    return torch.tensor(rows)


@pytest.mark.parametrize('ratio', RATIOS)
def test_piecewise_matches_eq18(ratio):
    alpha, beta, gamma = ratio_to_abg(ratio)
    x = torch.arange(-300, 301)
    expected = torch.tensor(
        [ref_piecewise(int(v), alpha, beta, gamma) for v in x])
    out = piecewise_index(x, alpha, beta, gamma)
    assert out.dtype == torch.long
    assert torch.equal(out, expected)
    # float inputs: rounded inside the identity range, Eq. 18 outside
    xf = torch.tensor([-7.3, -1.2, -0.4, 0.0, 0.6, 1.4, 2.6, 11.9, 55.5])
    expected = torch.tensor(
        [ref_piecewise(float(v), alpha, beta, gamma) for v in xf])
    assert torch.equal(piecewise_index(xf.double(), alpha, beta, gamma),
                       expected)


@pytest.mark.parametrize('ratio', RATIOS)
def test_piecewise_odd_monotone_bounded(ratio):
    alpha, beta, gamma = ratio_to_abg(ratio)
    x = torch.arange(-1000, 1001)
    y = piecewise_index(x, alpha, beta, gamma)
    b = int(beta)
    assert torch.equal(y, -y.flip(0))  # odd
    assert bool((y[1:] >= y[:-1]).all())  # monotone non-decreasing
    assert int(y.min()) == -b and int(y.max()) == b
    exact = x.abs() <= alpha
    assert torch.equal(y[exact], x[exact])  # identity near zero
    assert max_index(BucketSpec(index='piecewise', ratio=ratio)) == b


def test_piecewise_paper_ratio_values():
    # ratio 1.9: 7 ids per axis; saturates from |x| = 4 on
    y = piecewise_index(torch.arange(0, 9), *ratio_to_abg(1.9))
    assert y.tolist() == [0, 1, 2, 2, 3, 3, 3, 3, 3]


@pytest.mark.parametrize('k', [1, 2, 5])
def test_clip_equals_clamp(k):
    x = torch.randint(-50, 51, (200, ))
    assert torch.equal(clip_index(x, k), x.clamp(-k, k))
    xf = torch.randn(200) * 10
    assert torch.equal(clip_index(xf, k), xf.round().long().clamp(-k, k))
    assert max_index(BucketSpec(index='clip', max_distance=k)) == k


@pytest.mark.parametrize('ratio,product', [(1.9, 49), (2.0, 81), (2.5, 121),
                                           (3.0, 169)])
def test_num_buckets_like_authors(ratio, product):
    # the authors' table in DETR-with-iRPE: ratio -> product buckets
    side = int(math.isqrt(product))
    product_spec = BucketSpec('product', ratio=ratio)
    assert get_num_buckets(product_spec) == product
    assert get_num_buckets(product_spec, skip=1) == product + 1
    for method in ('euclidean', 'quant'):
        assert get_num_buckets(BucketSpec(method, ratio=ratio)) == side
        assert get_num_buckets(BucketSpec(method, ratio=ratio),
                               skip=2) == side + 1
    cross = BucketSpec('cross', ratio=ratio)
    assert get_num_buckets(cross) == 2 * side
    assert get_num_buckets(cross, skip=1) == 2 * (side + 1)
    assert num_buckets_per_table(cross, skip=1) == side + 1
    assert get_num_buckets(BucketSpec('product', 'clip',
                                      max_distance=3)) == 49


@pytest.mark.parametrize('index,ratio,k', [('piecewise', 1.9, None),
                                           ('piecewise', 1.0, None),
                                           ('clip', 1.9, 2)])
@pytest.mark.parametrize('size', [1, 2, 9, 20])
def test_relative_index_1d(index, ratio, k, size):
    out = relative_index_1d(size, BucketSpec(index=index, ratio=ratio,
                                             max_distance=k))
    assert out.shape == (size, size) and out.dtype == torch.long
    for p in range(size):
        for q in range(size):
            assert int(out[p, q]) == ref_index(p - q, index, ratio, k)


# (height, width): degenerate grids, a grid larger than gamma = 8 (ratio 1)
# on both axes, and odd shapes
GRIDS = [(1, 1), (1, 6), (6, 1), (2, 3), (4, 4), (10, 11)]
INDEXES = [('piecewise', 1.0, None), ('piecewise', 1.9, None),
           ('clip', 1.9, 2)]


@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('index,ratio,k', INDEXES)
@pytest.mark.parametrize('skip', [0, 1, 2])
@pytest.mark.parametrize('grid', GRIDS)
def test_bucket_ids_match_loops(method, index, ratio, k, skip, grid):
    height, width = grid
    spec = BucketSpec(method, index, ratio, k)
    ids = get_bucket_ids_2d(height, width, spec, skip)
    expected = ref_bucket_ids(height, width, method, index, ratio, k, skip)
    assert ids.dtype == torch.long
    assert torch.equal(ids, expected)
    num = get_num_buckets(spec, skip)
    assert int(ids.min()) >= 0 and int(ids.max()) < num


@pytest.mark.parametrize('method', ['product', 'cross'])
def test_bucket_ids_larger_than_gamma_paper_ratio(method):
    # ratio 1.9: gamma = 15.2, the grid exceeds it on both axes
    ids = get_bucket_ids_2d(17, 18, BucketSpec(method, ratio=1.9), skip=1)
    expected = ref_bucket_ids(17, 18, method, 'piecewise', 1.9, None, 1)
    assert torch.equal(ids, expected)


def test_bucket_ids_detr_grid():
    # 800 x 1333 at stride 32: every id of the full 25 x 42 grid
    ids = get_bucket_ids_2d(25, 42, BucketSpec('product', ratio=1.9))
    expected = ref_bucket_ids(25, 42, 'product', 'piecewise', 1.9, None, 0)
    assert torch.equal(ids, expected)
    assert set(ids.unique().tolist()) == set(range(49))  # all reachable


@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('rows,cols', [
    ((0, 30), None),  # all queries
    ((4, 11), None),  # a chunk of rows starting and ending inside grid rows
    ((29, 30), None),  # the last query
    (None, (5, 17)),  # a range of keys (iRPE on queries, read transposed)
    (None, (0, 1)),
    ((2, 9), (13, 30)),
])
def test_block_ids_match_loops(method, rows, cols):
    """Any block of the (L0, L0) map from the per-axis tables, never the
    map: the loop reference's block (5 x 6 grid, ratio 1)."""
    height, width, ratio = 5, 6, 1.0
    side = 2 * max_index(BucketSpec(method, ratio=ratio)) + 1
    tables = axis_bucket_tables(height, width, BucketSpec(method, ratio=ratio))
    got = spatial_bucket_ids(tables, height, width, method, side, rows, cols,
                             col_offset=side)
    # without skip tokens the reference offsets cross's column ids by
    # num_buckets_per_table = side, as col_offset above
    expected = ref_bucket_ids(height, width, method, 'piecewise', ratio,
                              None, 0)
    r0, r1 = rows or (0, 30)
    c0, c1 = cols or (0, 30)
    assert torch.equal(got, expected[..., r0:r1, c0:c1])


def test_bucket_conventions():
    # query (0, 0), key (0, 1): dy = 0, dx = -1 -> (0 + 3) * 7 + (-1 + 3)
    ids = get_bucket_ids_2d(2, 3, BucketSpec('product', ratio=1.9))
    assert int(ids[0, 1]) == 23 and int(ids[1, 0]) == 25
    # query (1, 0), key (0, 0): dy = +1 is the major digit
    assert int(ids[3, 0]) == (1 + 3) * 7 + 3
    # directed methods mirror under a swap of query and key
    assert torch.equal(ids.t(), 48 - ids)
    ids = get_bucket_ids_2d(3, 3, BucketSpec('euclidean', ratio=1.9))
    assert torch.equal(ids, ids.t()) and int(ids.min()) == 3
    cross = get_bucket_ids_2d(2, 3, BucketSpec('cross', ratio=1.9), skip=1)
    assert cross.shape == (2, 7, 7)
    assert int(cross[0, 0, 0]) == 7 and int(cross[1, 0, 0]) == 15
    assert int(cross[1, 1:, 1:].min()) == 8 + 3 - 2  # offset 8, dx >= -2


def test_errors():
    with pytest.raises(ValueError, match=r"`method` 'hexagonal'.*'product'"):
        BucketSpec('hexagonal')
    with pytest.raises(ValueError, match=r"`index` 'bucket'.*'clip'"):
        BucketSpec(index='bucket')


def test_bucket_spec_is_a_frozen_hashable_value():
    """The plan caches key on it: equal parameters, equal keys."""
    a, b = BucketSpec('cross', 'clip', 1.9, 3), BucketSpec('cross', 'clip',
                                                          1.9, 3)
    assert a == b and hash(a) == hash(b) and len({a: 1, b: 2}) == 1
    assert a != BucketSpec('cross', 'clip', 1.9, 4)
    with pytest.raises(AttributeError):
        a.ratio = 2.0
    assert BucketSpec() == BucketSpec('product', 'piecewise', 1.9, None)
