"""Tests of the iRPE module against explicit loops over token pairs."""
import itertools
import math

import numpy as np
import pytest
import torch

from mmdet.registry import MODELS
from mmpe.models.layers import iRPE
from mmpe.models.layers.irpe.buckets import get_bucket_ids_2d
from mmpe.models.layers.irpe.index import BucketSpec

# float64 reference vs the module in float64: only summation order differs
_F64_ATOL = 1e-10
# bf16 keeps 8 mantissa bits: ~0.4% per rounding, a few roundings deep
_BF16_RTOL = 3e-2

COMBOS = [(mode, method, on) for mode, method, on in itertools.product(
    iRPE.MODES, iRPE.METHODS, iRPE.ONS) if not (mode == 'bias' and on == 'v')]


def pair_bucket(rpe: iRPE, height: int, width: int, i: int, j: int):
    """Table rows of the (query i, key j) pair, from the paper's formulas."""
    skip = rpe.skip
    b = int(2 * rpe.ratio) if rpe.index == 'piecewise' else rpe.max_distance
    side = 2 * b + 1
    per = side * side if rpe.method == 'product' else side
    per += int(skip > 0)
    if i < skip or j < skip:
        return (per - 1, 2 * per - 1) if rpe.method == 'cross' else (per - 1, )
    qi, kj = i - skip, j - skip
    dy = qi // width - kj // width
    dx = qi % width - kj % width

    def g(x):
        if rpe.index == 'clip':
            return max(-b, min(b, int(round(x))))
        alpha, beta, gamma = rpe.ratio, 2 * rpe.ratio, 8 * rpe.ratio
        if abs(x) <= alpha:
            return int(round(x))
        y = alpha + math.log(abs(x) / alpha) / math.log(
            gamma / alpha) * (beta - alpha)
        return int(math.copysign(min(beta, round(y)), x))

    if rpe.method == 'product':
        return ((g(dy) + b) * side + g(dx) + b, )
    if rpe.method == 'euclidean':
        return (g(round(math.sqrt(dy * dy + dx * dx))) + b, )
    if rpe.method == 'quant':
        return (g(dy * dy + dx * dx) + b, )
    return (g(dy) + b, g(dx) + b + per)  # cross: summed encodings


def loop_reference(rpe: iRPE, x: torch.Tensor, table: torch.Tensor,
                   height: int, width: int) -> torch.Tensor:
    """iRPE term by loops over heads, queries i and keys j (Eq. 13-17).

    Differentiable in ``x`` and ``table`` (float64 recommended).
    """
    batch, heads, length = x.shape[:3]
    if rpe.shared_head:
        table = table.expand(heads, *table.shape[1:])

    def r(h, i, j):  # encoding of the pair (summed for cross)
        return sum(table[h, q] for q in pair_bucket(rpe, height, width, i, j))

    out = []
    for h in range(heads):
        rows = []
        for i in range(length):
            if rpe.on == 'v':  # sum_j a_ij r_ij
                rows.append(
                    sum(x[:, h, i, j, None] * r(h, i, j)
                        for j in range(length)))
                continue
            row = []
            for j in range(length):
                if rpe.on == 'k':  # query i meets r(i, j)
                    enc = r(h, i, j)
                    row.append(
                        enc.expand(1) if rpe.mode == 'bias' else x[:, h,
                                                                   i] @ enc)
                else:  # on q: key j meets r(j, i), the authors' convention
                    enc = r(h, j, i)
                    row.append(
                        enc.expand(1) if rpe.mode == 'bias' else x[:, h,
                                                                   j] @ enc)
            rows.append(torch.stack(row, -1))
        out.append(torch.stack(rows, 1))
    return torch.stack(out, 1)


def make_input(rpe: iRPE, batch: int, length: int, dtype=torch.float64):
    if rpe.on == 'v':  # attention probabilities
        return torch.randn(batch, rpe.num_heads, length, length,
                           dtype=dtype).softmax(-1)
    return torch.randn(batch, rpe.num_heads, length, rpe.head_dim, dtype=dtype)


@pytest.mark.parametrize('mode,method,on', COMBOS)
@pytest.mark.parametrize('shared_head', [True, False])
@pytest.mark.parametrize('skip', [0, 2])
def test_forward_backward_match_loops(mode, method, on, shared_head, skip):
    torch.manual_seed(0)
    height, width = 3, 4
    rpe = iRPE(4,
               2,
               mode=mode,
               method=method,
               on=on,
               ratio=1.2,
               shared_head=shared_head,
               skip=skip).double()
    with torch.no_grad():  # random, non-zero tables
        rpe.table.normal_()
    length = skip + height * width
    x = make_input(rpe, 2, length).requires_grad_()
    out = rpe(x, height, width)
    table = rpe.table.detach().clone().requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    ref = loop_reference(rpe, x_ref, table, height, width)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=0, atol=_F64_ATOL)

    grad = torch.randn_like(ref)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(rpe.table.grad,
                               table.grad,
                               rtol=0,
                               atol=_F64_ATOL)
    if mode == 'contextual':
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=_F64_ATOL)


@pytest.mark.parametrize('method', iRPE.METHODS)
@pytest.mark.parametrize('index', ['piecewise', 'clip'])
def test_larger_grid_and_clip_match_loops(method, index):
    # a grid larger than gamma = 8 (ratio 1) on both axes, batch 1
    torch.manual_seed(1)
    kwargs = dict(max_distance=2) if index == 'clip' else dict(ratio=1.0)
    rpe = iRPE(2, 1, method=method, index=index, **kwargs).double()
    with torch.no_grad():
        rpe.table.normal_()
    x = make_input(rpe, 1, 9 * 10)
    ref = loop_reference(rpe, x, rpe.table.detach(), 9, 10)
    torch.testing.assert_close(rpe(x, 9, 10), ref, rtol=0, atol=_F64_ATOL)


@pytest.mark.parametrize('grid', [(1, 1), (1, 5), (5, 1)])
@pytest.mark.parametrize('on', ['q', 'k', 'v'])
def test_degenerate_grids(grid, on):
    torch.manual_seed(2)
    rpe = iRPE(3, 2, on=on, skip=1, shared_head=False).double()
    with torch.no_grad():
        rpe.table.normal_()
    x = make_input(rpe, 2, 1 + grid[0] * grid[1])
    ref = loop_reference(rpe, x, rpe.table.detach(), *grid)
    torch.testing.assert_close(rpe(x, *grid), ref, rtol=0, atol=_F64_ATOL)


@pytest.mark.parametrize('mode,method,on', COMBOS)
def test_gradcheck(mode, method, on):
    torch.manual_seed(3)
    rpe = iRPE(3,
               2,
               mode=mode,
               method=method,
               on=on,
               ratio=0.9,
               skip=1,
               shared_head=False).double()
    x = make_input(rpe, 2, 1 + 2 * 3).requires_grad_()
    table = torch.randn_like(rpe.table).requires_grad_()
    del rpe.table  # a plain tensor in its place, so gradcheck can vary it

    def fn(x, table):
        rpe.table = table
        return rpe(x, 2, 3)

    assert torch.autograd.gradcheck(fn, (x, table))


@pytest.mark.parametrize(
    'mode,method,on',
    [
        ('contextual', 'product', 'k'),  # the fused in-place path
        ('contextual', 'product', 'q'),
        ('contextual', 'euclidean', 'k'),
        ('contextual', 'cross', 'q'),
        ('bias', 'product', 'k'),
    ])
@pytest.mark.parametrize('skip', [0, 1])
def test_add_to_logits_in_place(mode, method, on, skip):
    torch.manual_seed(7)
    rpe = iRPE(4,
               2,
               mode=mode,
               method=method,
               on=on,
               skip=skip,
               shared_head=False).double()
    with torch.no_grad():
        rpe.table.normal_()
    length = skip + 3 * 4
    q = torch.randn(2, 2, length, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, length, 4, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 2, length, length, dtype=torch.float64)

    def run(fused):
        q.grad = k.grad = rpe.table.grad = None
        logits = q @ k.transpose(-1, -2)
        x = q if on == 'k' else k
        if fused:
            out = rpe(x, 3, 4, logits=logits)
            assert out.data_ptr() == logits.data_ptr()  # in place
        else:
            out = logits + rpe(x, 3, 4)
        out.backward(grad)
        return out.detach(), q.grad, k.grad, rpe.table.grad

    for a, b in zip(run(True), run(False)):
        torch.testing.assert_close(a, b, rtol=0, atol=_F64_ATOL)


@pytest.mark.parametrize('on', ['q', 'k', 'v'])
@pytest.mark.parametrize('method', ['product', 'euclidean'])
def test_authors_table_layout(on, method):
    """A table in the authors' layout, used as their release does."""
    torch.manual_seed(8)
    rpe = iRPE(4, 2, method=method, on=on, skip=1, shared_head=False).double()
    nb, length = rpe.num_buckets, 1 + 3 * 4
    # authors: q / k (H', head_dim, nb); v (H', nb, head_dim)
    shape = (2, nb, 4) if on == 'v' else (2, 4, nb)
    weight = torch.randn(shape, dtype=torch.float64)
    with torch.no_grad():
        rpe.table.copy_(weight if on == 'v' else weight.transpose(1, 2))
    ids = torch.tensor(
        [[pair_bucket(rpe, 3, 4, i, j)[0] for j in range(length)]
         for i in range(length)])
    x = make_input(rpe, 2, length)
    if on == 'v':  # (B, H, L, L) @ (H, L, L, D) summed over keys
        expected = torch.einsum('bhij,hijd->bhid', x, weight[:, ids])
    else:  # lookup (B, H, L, nb), then index row i with ids[i]
        lookup = x @ weight
        expected = lookup.gather(-1, ids.expand(2, 2, -1, -1))
        if on == 'q':  # attn += rpe_q(k).transpose(-2, -1)
            expected = expected.transpose(-1, -2)
    torch.testing.assert_close(rpe(x, 3, 4), expected, rtol=0, atol=_F64_ATOL)


def test_shapes_and_buckets():
    rpe = iRPE(32, 8)  # the paper's DETR setting: ctx product on keys
    assert rpe.num_buckets == 49 and rpe.table.shape == (1, 49, 32)
    assert torch.count_nonzero(rpe.table) == 0  # zeros by default
    assert isinstance(rpe.table, torch.nn.Parameter)
    assert iRPE(32, 8, ratio=2.0).num_buckets == 81
    bias = iRPE(32, 8, mode='bias', shared_head=False, skip=1)
    assert bias.num_buckets == 50 and bias.table.shape == (8, 50)
    cross = iRPE(16, 4, method='cross', on='v', skip=1)
    assert cross.num_buckets == 16 and cross.table.shape == (1, 16, 16)

    q = torch.randn(2, 8, 12, 32)
    assert rpe(q, 3, 4).shape == (2, 8, 12, 12)
    assert bias(torch.randn(2, 8, 13, 32), 3, 4).shape == (1, 8, 13, 13)
    attn = torch.randn(2, 4, 13, 13).softmax(-1)
    assert cross(attn, 3, 4).shape == (2, 4, 13, 16)

    ids = rpe.bucket_ids(3, 4)
    assert ids.shape == (12, 12)
    assert torch.equal(ids, get_bucket_ids_2d(3, 4, BucketSpec('product')))
    ids = cross.bucket_ids(3, 4)
    assert ids.shape == (2, 13, 13)
    assert int(ids.max()) == cross.num_buckets - 1
    assert rpe.bucket_ids(np.int64(2), np.int64(3)).shape == (6, 6)


def test_registry_and_state_dict():
    rpe = MODELS.build(dict(type='iRPE', head_dim=8, num_heads=2, on='q'))
    assert isinstance(rpe, iRPE)
    rpe(torch.randn(1, 2, 6, 8), 2, 3)  # fills the bucket cache
    assert list(rpe.state_dict()) == ['table']


@pytest.mark.parametrize('mode,on', [('contextual', 'k'), ('contextual', 'v'),
                                     ('bias', 'q')])
def test_init_options(mode, on):
    torch.manual_seed(5)
    rpe = iRPE(32, 8, mode=mode, on=on, shared_head=False, init='xavier')
    nb = rpe.num_buckets
    # fans of the authors' layouts: bias (H, nb); q / k (H, head_dim, nb);
    # v (H, nb, head_dim), as xavier_uniform_ computes them there
    fan_in, fan_out = {
        'bias': (nb, 8),
        'k': (32 * nb, 8 * nb),
        'v': (nb * 32, 8 * 32)
    }['bias' if mode == 'bias' else on]
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    table = rpe.table.detach()
    assert float(table.abs().max()) <= bound
    assert float(table.abs().max()) > 0.9 * bound
    rpe = iRPE(32, 8, mode=mode, on=on, init='trunc_normal')
    assert 0.01 < float(rpe.table.detach().std()) < 0.03
    rpe.init = 'zeros'
    rpe.init_weights()
    assert torch.count_nonzero(rpe.table) == 0


def test_bucket_cache_hits_and_bounded():
    iRPE.cache_clear()
    rpe = iRPE(8, 2)
    x = torch.randn(1, 2, 12, 8)
    rpe(x, 3, 4)
    info = iRPE.cache_info()
    assert (info.hits, info.misses, info.size) == (0, 1, 1)
    rpe(x, 3, 4)
    iRPE(8, 2, on='q')(x, 3, 4)  # same config and size: shared entry
    assert iRPE.cache_info().hits == 2 and iRPE.cache_info().misses == 1
    rpe(x, 4, 3)  # another size is another entry
    assert iRPE.cache_info().misses == 2
    for width in range(1, 51):  # a stream of 50 sizes
        rpe(torch.randn(1, 2, width, 8), 1, width)
    info = iRPE.cache_info()
    assert info.size == info.maxsize == 32
    assert list(rpe.state_dict()) == ['table']


@pytest.mark.parametrize('method', iRPE.METHODS)
@pytest.mark.parametrize('on', ['q', 'k', 'v'])
def test_bf16_autocast_close_to_fp32(method, on):
    torch.manual_seed(6)
    rpe = iRPE(32, 4, method=method, on=on, init='xavier')
    x = make_input(rpe, 2, 6 * 7, dtype=torch.float32)
    x.requires_grad_()
    ref = rpe(x, 6, 7)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = rpe(x, 6, 7)
    assert torch.isfinite(out).all()
    scale = float(ref.detach().abs().max())
    torch.testing.assert_close(out.float(),
                               ref.detach(),
                               rtol=0,
                               atol=_BF16_RTOL * scale)
    out.float().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert torch.isfinite(rpe.table.grad).all()
    if on != 'v':  # in-place into bf16 logits (the fused path on k)
        logits = torch.zeros(2, 4, 42, 42, dtype=torch.bfloat16)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = rpe(x.detach(), 6, 7, logits=logits)
        torch.testing.assert_close(out.float(),
                                   ref.detach(),
                                   rtol=0,
                                   atol=_BF16_RTOL * scale)


def test_dtype_follows_input():
    rpe = iRPE(8, 2, mode='bias')
    assert rpe(torch.randn(1, 2, 6, 8).double(), 2, 3).dtype == torch.float64
    rpe = iRPE(8, 2, on='v').to(torch.bfloat16)
    attn = torch.rand(1, 2, 6, 6, dtype=torch.bfloat16)
    assert rpe(attn, 2, 3).dtype == torch.bfloat16


# --- errors: each names the field and the bad value ------------------------


@pytest.mark.parametrize('kwargs,words', [
    (dict(mode='ctx'), ['mode', "'ctx'", 'contextual']),
    (dict(method='euc'), ['method', "'euc'", 'euclidean']),
    (dict(on='x'), ['`on`', "'x'", "'v'"]),
    (dict(index='log'), ['index', "'log'", 'piecewise']),
    (dict(mode='bias', on='v'), ['`on`', "'v'", 'bias']),
    (dict(ratio=0), ['ratio', '0', '> 0']),
    (dict(ratio=-1.9), ['ratio', '-1.9']),
    (dict(ratio=float('nan')), ['ratio', 'nan']),
    (dict(index='clip'), ['max_distance', 'None', 'clip']),
    (dict(index='clip', max_distance=0), ['max_distance', '0', 'clip']),
    (dict(index='clip', max_distance=2.5), ['max_distance', '2.5']),
    (dict(max_distance=3), ['max_distance', '3', 'piecewise']),
    (dict(skip=-1), ['skip', '-1', '>= 0']),
    (dict(skip=1.0), ['skip', '1.0']),
    (dict(shared_head='yes'), ['shared_head', "'yes'"]),
    (dict(init='kaiming'), ['init', "'kaiming'", 'xavier']),
    (dict(head_dim=0), ['head_dim', '0']),
    (dict(num_heads=-2), ['num_heads', '-2']),
    (dict(num_heads=True), ['num_heads', 'True']),
])
def test_invalid_arguments(kwargs, words):
    args = dict(head_dim=8, num_heads=2)
    args.update(kwargs)
    with pytest.raises(ValueError) as err:
        iRPE(**args)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_forward_errors():
    rpe = iRPE(8, 2, skip=1)
    with pytest.raises(ValueError, match=r'length 12 .* = 13'):
        rpe(torch.randn(1, 2, 12, 8), 3, 4)
    with pytest.raises(ValueError, match='3 heads'):
        rpe(torch.randn(1, 3, 13, 8), 3, 4)
    with pytest.raises(ValueError, match='last dim of 8, got 4'):
        rpe(torch.randn(1, 2, 13, 4), 3, 4)
    with pytest.raises(ValueError, match='`height` 0'):
        rpe(torch.randn(1, 2, 1, 8), 0, 4)
    with pytest.raises(ValueError, match='4D'):
        rpe(torch.randn(2, 13, 8), 3, 4)
    with pytest.raises(ValueError, match=r'`logits` must be'):
        rpe(torch.randn(1, 2, 13, 8), 3, 4, logits=torch.randn(1, 2, 13, 12))
    rpe_v = iRPE(8, 2, on='v')
    with pytest.raises(ValueError, match=r"`on` 'v'"):
        rpe_v(torch.rand(1, 2, 12, 12), 3, 4, logits=torch.randn(1, 2, 12, 12))
    with pytest.raises(ValueError, match='last dim of 12, got 8'):
        rpe_v(torch.randn(1, 2, 12, 8), 3, 4)
