"""Fused FlexAttention iRPE against a direct reference and the explicit path.
"""
import math

import pytest
import torch

from mmpe.models.layers import PEAttention, iRPE, PEMultiheadAttention
from mmpe.models.layers.attention import core
from mmpe.models.layers.attention.backends import choice
from mmpe.models.layers.attention.backends import flex as flex_backend
from mmpe.models.layers.attention import ops as attention_ops
from mmpe.models.layers.attention.backend_rule import AUTO_CHUNKED_FROM
from mmpe.models.layers.attention.flex import (FLEX_AVAILABLE,
                                               flex_unsupported_reason,
                                               irpe_flex_attention)
from mmpe.models.layers.attention.flex_shapes import (padded_length,
                                                      table_side,
                                                      tail_block_mask)

# eager FlexAttention warns that it is unfused: that is the point here
pytestmark = pytest.mark.filterwarnings('ignore:flex_attention called without')


def test_flex_attention_is_available():
    """The fixed stack's PyTorch has FlexAttention (a missing one fails
    here, as every test below)."""
    assert FLEX_AVAILABLE, f'no FlexAttention in torch {torch.__version__}'


# float32 softmax attention of O(1) logits: rounding stays well below this
ATOL = 2e-5


def _rpe(mode, method, on, skip, shared, seed):
    torch.manual_seed(seed)
    rpe = iRPE(8, 2, mode=mode, method=method, on=on, ratio=1.0, skip=skip,
               shared_head=shared)
    with torch.no_grad():
        rpe.table.normal_()
    return rpe


def _pair(rpe, ids, head, p, r):
    """Table row(s) of the pair (viewer p, other r); cross sums its axes."""
    h = 0 if rpe.shared_head else head
    if ids.dim() == 3:
        return rpe.table[h, ids[0, p, r]] + rpe.table[h, ids[1, p, r]]
    return rpe.table[h, ids[p, r]]


def reference(q, k, v, hw, rpe_k, rpe_q, mask):
    """Eq. 13-16 with every term read from ``bucket_ids``, pair by pair."""
    bs, heads, n, d = q.shape
    scale = 1 / math.sqrt(d)
    logits = (q * scale) @ k.transpose(-1, -2)
    for rpe, x, swap in ((rpe_k, q, False), (rpe_q, k, True)):
        if rpe is None:
            continue
        ids = rpe.bucket_ids(*hw)
        for b in range(bs):
            for h in range(heads):
                for i in range(n):
                    for j in range(n):
                        # r^Q is seen from the key: bucket (j, i), x_j
                        p, r = (j, i) if swap else (i, j)
                        t = _pair(rpe, ids, h, p, r)
                        logits[b, h, i, j] += (x[b, h, p] * scale @ t
                                               if t.dim() else t)
    if mask is not None:
        logits = logits.masked_fill(mask[:, None, None, :], float('-inf'))
    return logits.softmax(-1) @ v


CASES = [(mode, method, on, skip, shared)
         for mode in ('contextual', 'bias')
         for method in ('product', 'cross', 'euclidean', 'quant')
         for on, skip, shared in (('k', 0, True), ('qk', 1, False),
                                  ('q', 2, True))]


@pytest.mark.parametrize('mode,method,on,skip,shared', CASES)
def test_score_mod_matches_reference(mode, method, on, skip, shared):
    hw = (2, 3)
    n = skip + hw[0] * hw[1]
    rpe_k = _rpe(mode, method, 'k', skip, shared, 1) if 'k' in on else None
    rpe_q = _rpe(mode, method, 'q', skip, shared, 2) if 'q' in on else None
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8) for _ in range(3))
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, -2:] = True
    with torch.no_grad():
        # eager FlexAttention: the same score_mod, without compiling
        got = irpe_flex_attention(q, k, v, *hw, rpe_k, rpe_q, mask,
                                  compiled=False)
        want = reference(q, k, v, hw, rpe_k, rpe_q, mask)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def _module(impl, rpe_on='k', **rpe):
    torch.manual_seed(0)
    m = PEMultiheadAttention(
        32, 4, batch_first=True, rpe_cfg=dict(ratio=1.0, **rpe),
        rpe_on=rpe_on, attn_impl=impl).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith('table'):
                p.normal_()
    return m


def _inputs(hw=(3, 4), skip=0):
    torch.manual_seed(1)
    n = skip + hw[0] * hw[1]
    x, pos = torch.randn(2, n, 32), torch.randn(2, n, 32)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, -3:] = True
    return x, pos, mask


@pytest.fixture
def eager_flex(monkeypatch):
    """Run the module's fused path with eager FlexAttention (no compile),
    recording the calls."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(args)
        return irpe_flex_attention(*args, **kwargs, compiled=False)

    monkeypatch.setattr(flex_backend, 'irpe_flex_attention', spy)
    return calls


@pytest.mark.parametrize('rpe', [
    dict(mode='contextual', method='product'),
    dict(mode='bias', method='cross', shared_head=False),
    dict(mode='bias', method='product'),
    dict(mode='contextual', method='quant', skip=1),
])
@pytest.mark.parametrize('rpe_on', ['k', 'qk'])
def test_module_flex_equals_explicit_forward(eager_flex, rpe, rpe_on):
    x, pos, mask = _inputs(skip=rpe.get('skip', 0))
    explicit = _module('explicit', rpe_on, **rpe)
    flex = _module('flex', rpe_on, **rpe)
    with torch.no_grad():
        want = explicit(x, query_pos=pos, key_padding_mask=mask,
                        spatial_shape=(3, 4))
        got = flex(x, query_pos=pos, key_padding_mask=mask,
                   spatial_shape=(3, 4))
    assert len(eager_flex) == 1
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize('rpe', [
    dict(mode='contextual', method='product'),
    dict(mode='bias', method='product'),
    dict(mode='contextual', method='cross', skip=2, shared_head=False),
])
@pytest.mark.parametrize('rpe_on', ['k', 'qk'])
def test_explicit_no_grad_path_equals_autograd_path(rpe, rpe_on):
    """Without grad the explicit path hands the terms to SDPA as a mask."""
    x, pos, mask = _inputs(skip=rpe.get('skip', 0))
    m = _module('explicit', rpe_on, **rpe)
    kwargs = dict(query_pos=pos, key_padding_mask=mask, spatial_shape=(3, 4))
    want = m(x, **kwargs)  # grad enabled: in-place logits, custom softmax
    with torch.no_grad():
        got = m(x, **kwargs)
    torch.testing.assert_close(got, want.detach(), atol=ATOL, rtol=0)


def test_flex_is_never_chosen_automatically_on_cpu(eager_flex):
    """The default ('auto') takes FlexAttention only on CUDA: on CPU neither
    inference nor training at a length where it chunks calls it; only
    attn_impl='flex' takes the fused path."""
    m = PEMultiheadAttention(
        32, 4, batch_first=True, rpe_cfg=dict(ratio=1.0)).eval()
    assert m.attn_impl == 'auto'
    x, pos, mask = _inputs()
    with torch.no_grad():
        m(x, query_pos=pos, key_padding_mask=mask, spatial_shape=(3, 4))
    grid = (32, AUTO_CHUNKED_FROM // 32)
    core = PEAttention(8, 2, rpe_cfg=dict(ratio=1.0, init='xavier'))
    q, k, v = (torch.randn(1, 2, grid[0] * grid[1], 4, requires_grad=True)
               for _ in range(3))
    core.attend(q, k, v, grid).sum().backward()
    assert not eager_flex
    with torch.no_grad():
        _module('flex')(x, query_pos=pos, key_padding_mask=mask,
                        spatial_shape=(3, 4))
    assert len(eager_flex) == 1


def test_size_buckets_are_powers_of_two_from_one_block():
    assert [padded_length(n) for n in (1, 6, 128, 129, 256, 257, 1156,
                                       2048, 2049)] == [
        128, 128, 128, 256, 256, 512, 2048, 2048, 4096]
    # at least 2 sqrt(Lp) cells per side (aspect ratios up to 4 fit) and
    # at least the grid's longest side
    assert table_side(34, 34, 2048) == 128
    assert table_side(20, 27, 1024) == 64
    assert table_side(1, 300, 512) == 512
    with pytest.raises(ValueError, match='length'):
        padded_length(0)


@pytest.mark.parametrize('length,padded', [(6, 128), (130, 256),
                                           (300, 512), (256, 256)])
def test_tail_block_mask_lists_the_blocks_of_real_tokens(length, padded):
    """Dense view of the BlockMask against the blocks written out: query
    and key blocks that hold a real token (index < length) meet."""
    dense = tail_block_mask(length, padded, torch.device('cpu')).to_dense()
    blocks = padded // 128
    want = torch.zeros(1, 1, blocks, blocks, dtype=dense.dtype)
    used = (length + 127) // 128
    want[..., :used, :used] = 1
    torch.testing.assert_close(dense, want)


@pytest.mark.parametrize('hw,skip', [((2, 150), 0), ((1, 129), 1),
                                     ((12, 11), 0)])
def test_padded_grids_equal_explicit(eager_flex, hw, skip):
    """Grids whose tokens are padded to the next bucket (long thin ones
    included: coordinates past the grid are clamped, its keys masked)."""
    n = skip + hw[0] * hw[1]
    torch.manual_seed(1)
    x, pos = torch.randn(2, n, 32), torch.randn(2, n, 32)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, -7:] = True
    rpe = dict(mode='contextual', method='product', skip=skip)
    explicit, flex = _module('explicit', 'qk', **rpe), _module('flex', 'qk',
                                                                **rpe)
    kwargs = dict(query_pos=pos, key_padding_mask=mask, spatial_shape=hw)
    with torch.no_grad():
        want, got = explicit(x, **kwargs), flex(x, **kwargs)
    assert len(eager_flex) == 1
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_cpu_backward_is_refused_and_flex_falls_back(eager_flex):
    assert flex_unsupported_reason(torch.device('cpu'), True) is not None
    assert flex_unsupported_reason(torch.device('cpu'), False) is None
    x, pos, mask = _inputs()
    explicit, flex = _module('explicit'), _module('flex')
    with pytest.warns(UserWarning, match='no backward on CPU'):
        got = flex(x, query_pos=pos, key_padding_mask=mask,
                   spatial_shape=(3, 4))
    assert not eager_flex
    want = explicit(x, query_pos=pos, key_padding_mask=mask,
                    spatial_shape=(3, 4))
    torch.testing.assert_close(got, want)
    got.sum().backward()  # the explicit path's backward


@pytest.mark.parametrize('case', ['rpe_v', 'attn_mask', 'dropout'])
def test_unsupported_calls_fall_back(eager_flex, case):
    rpe_on = 'kv' if case == 'rpe_v' else 'k'
    m = _module('flex', rpe_on)
    x, pos, mask = _inputs()
    kwargs = dict(query_pos=pos, key_padding_mask=mask, spatial_shape=(3, 4))
    if case == 'attn_mask':
        kwargs['attn_mask'] = torch.zeros(12, 12, dtype=torch.bool)
    if case == 'dropout':
        m.attn_drop_prob = 0.1
        m.train()
    with torch.no_grad(), pytest.warns(UserWarning, match='falls back'):
        m(x, **kwargs)
    assert not eager_flex


def test_compile_failure_falls_back_once(monkeypatch):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError('no C++ compiler')

    monkeypatch.setattr(flex_backend, 'irpe_flex_attention', broken)
    x, pos, mask = _inputs()
    m = _module('flex')
    with torch.no_grad():
        with pytest.warns(UserWarning, match='no C\\+\\+ compiler'):
            got = m(x, query_pos=pos, key_padding_mask=mask,
                    spatial_shape=(3, 4))
        with pytest.warns(UserWarning, match='compilation failed before'):
            m(x, query_pos=pos, key_padding_mask=mask, spatial_shape=(3, 4))
        want = _module('explicit')(
            x, query_pos=pos, key_padding_mask=mask, spatial_shape=(3, 4))
    assert calls == [1]  # not retried
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize('inplace', [True, False])
def test_masked_softmax_gradcheck(monkeypatch, inplace):
    """The explicit path's softmax: in place on CPU, out of place on other
    devices (forced here on CPU)."""
    if not inplace:
        monkeypatch.setattr(attention_ops, '_SOFTMAX_INPLACE_DEVICES', ())
    torch.manual_seed(0)
    x = torch.randn(2, 2, 3, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 1, 1, 5, dtype=torch.float64)
    mask[1, ..., -2:] = float('-inf')

    def fn(t):
        # (t * 1) is a fresh non-leaf the function may overwrite
        return attention_ops._MaskedSoftmax.apply(t * 1, mask) * 1

    torch.testing.assert_close(fn(x), (x + mask).softmax(-1))
    assert torch.autograd.gradcheck(fn, (x, ))


def test_bad_attn_impl_names_the_choices():
    with pytest.raises(ValueError, match=r"attn_impl.*'fast'.*'explicit'.*'fused'.*'sdpa'.*'flex'"):
        PEMultiheadAttention(32, 4, rpe_cfg={}, attn_impl='fast')


@pytest.mark.slow
def test_compiled_kernel_equals_explicit_on_cpu():
    """The real fused kernel (torch.compile; a C++ build of ~10-30 s)."""
    x, pos, mask = _inputs(hw=(4, 5))
    explicit = _module('explicit', 'qk', mode='contextual', method='product')
    flex = _module('flex', 'qk', mode='contextual', method='product')
    with torch.no_grad():
        want = explicit(x, query_pos=pos, key_padding_mask=mask,
                        spatial_shape=(4, 5))
        got = flex(x, query_pos=pos, key_padding_mask=mask,
                   spatial_shape=(4, 5))
    assert not flex._flex_failed, 'the kernel did not compile'
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------
# training on CUDA (PyTorch refuses FlexAttention's backward on CPU)
# ---------------------------------------------------------------------------
cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason='FlexAttention trains on CUDA only (no backward on CPU)')
# float32 kernels that sum in another order (flex tiles, cuBLAS); no TF32
CUDA_ATOL = 1e-4


@pytest.fixture
def fresh_dynamo():
    """Each CUDA test compiles from an empty dynamo cache: every iRPE
    setting is a kernel of its own, and under a PyTorch without a
    per-wrapper limit (2.11) dynamo's limit of 8 per code object counted
    every earlier test's kernels (then the layer falls back, and the
    setting is not tested)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _cores(rpe_on, mode, method, skip, shared):
    """An explicit and a flex PEAttention with the same random tables."""
    cores = []
    for impl in ('explicit', 'flex'):
        torch.manual_seed(0)
        core = PEAttention(
            32, 2, rpe_on=rpe_on, skip=skip, attn_impl=impl,
            rpe_cfg=dict(mode=mode, method=method, ratio=1.0,
                         shared_head=shared, init='xavier')).cuda()
        cores.append(core)
    return cores


def _train_call(core, grid, skip):
    torch.manual_seed(1)
    n = skip + grid[0] * grid[1]
    q, k, v = (torch.randn(2, 2, n, 16, device='cuda', requires_grad=True)
               for _ in range(3))
    mask = torch.zeros(2, n, dtype=torch.bool, device='cuda')
    mask[1, -5:] = True
    out = core.attend(q, k, v, grid, mask)
    out.backward(torch.randn_like(out))
    tables = {n: p.grad for n, p in core.named_parameters()}
    return out.detach(), (q.grad, k.grad, v.grad), tables


@cuda
@pytest.mark.usefixtures('fresh_dynamo')
@pytest.mark.parametrize('mode,method,on,skip,shared', CASES)
def test_cuda_flex_training_equals_explicit(mode, method, on, skip, shared):
    """Forward and backward of the fused kernel: gradients of q, k, v and,
    through the per-bucket lookups, of the tables."""
    assert not torch.backends.cuda.matmul.allow_tf32
    explicit, flex = _cores(on, mode, method, skip, shared)
    want = _train_call(explicit, (5, 7), skip)
    got = _train_call(flex, (5, 7), skip)
    assert not flex._flex_failed and not flex._warned
    torch.testing.assert_close(got[0], want[0], atol=CUDA_ATOL, rtol=0)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, atol=CUDA_ATOL, rtol=0)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name],
                                   atol=CUDA_ATOL, rtol=0, msg=name)


@cuda
@pytest.mark.usefixtures('fresh_dynamo')
@pytest.mark.parametrize('free', [None, 0])
def test_cuda_auto_trains_without_flex(monkeypatch, free):
    """attn_impl='auto' trains on CUDA with the explicit backend while its
    memory estimate fits the free memory (here: the device's own), with the
    chunked one when it does not (free memory 0), never with FlexAttention
    (its backward failed to compile for most settings on an H100, PyTorch
    2.11), equal to the explicit backend."""
    calls = []
    real = flex_backend.irpe_flex_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(flex_backend, 'irpe_flex_attention', spy)
    if free is not None:
        monkeypatch.setattr(choice, 'cuda_free_bytes', lambda dev: free)
    grid = (32, AUTO_CHUNKED_FROM // 32)
    explicit, _ = _cores('qk', 'contextual', 'product', 0, True)
    torch.manual_seed(0)
    auto = PEAttention(32, 2, rpe_on='qk', rpe_cfg=dict(
        mode='contextual', method='product', ratio=1.0,
        init='xavier')).cuda()
    auto.load_state_dict(explicit.state_dict())
    want = _train_call(explicit, grid, 0)
    got = _train_call(auto, grid, 0)
    assert not calls  # which of the two runs: test_backend_rule.py
    torch.testing.assert_close(got[0], want[0], atol=CUDA_ATOL, rtol=0)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, atol=CUDA_ATOL, rtol=0)
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name],
                                   atol=CUDA_ATOL, rtol=0, msg=name)


@cuda
@pytest.mark.usefixtures('fresh_dynamo')
def test_cuda_flex_training_one_compilation_per_size_bucket():
    """Grids of one size bucket (129-256 tokens) train with one
    compilation, each equal to the explicit backend forward and
    backward."""
    explicit, flex = _cores('k', 'contextual', 'product', 0, True)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    for grid in ((9, 15), (12, 20), (16, 16), (11, 13)):
        want = _train_call(explicit, grid, 0)
        got = _train_call(flex, grid, 0)
        torch.testing.assert_close(got[0], want[0], atol=CUDA_ATOL, rtol=0)
        for g, w in zip(got[1], want[1]):
            torch.testing.assert_close(g, w, atol=CUDA_ATOL, rtol=0)
    assert not flex._warned and not flex._flex_failed
    assert counters['stats']['unique_graphs'] == 1
