"""The fused attention kernel of CUDA, written in Triton
(:mod:`mmpe.models.layers.attention.fused_triton`), run here by Triton's
interpreter on CPU tensors (``TRITON_INTERPRET=1``, set by the conftest
where no GPU is) and on the GPU by ``make gpu-check``.

Expected values: a dense reference written here from the
:class:`~mmpe.models.layers.AxisValues` contract (every pair's bucket(s)
found one ``(i, j)`` at a time with the bucket tables, in float64, then
softmax and autograd's gradients) for the kernel itself; the explicit
backend in float64 (checked against per-pair loops of the iRPE paper's
Eq. 13-17 in test_irpe_attention.py, the decomposed relative position
against MViTv2 / ViTDet's equations in test_rel_pos.py, BoxRPB against
Plain-DETR's code in test_box_rpb.py) for every module setting the kernel
reads.
"""
import types

import pytest
import torch

from mmpe.models.layers import AxisValues, PEAttention
from mmpe.models.layers.attention import backend_rule
from mmpe.models.layers.attention.backends import (ATTENTION_BACKENDS,
                                                   AttentionRequest, choice,
                                                   fused_cuda)
from mmpe.models.layers.attention.backend_rule import (AttentionCall,
                                                       auto_backend)
from mmpe.models.layers.attention.cross import CrossPEAttention
from mmpe.models.layers.attention.ops import additive_mask
from mmpe.models.layers.attention.fused_triton import (
    TRITON_DTYPES, dropout_mask, interpreted, triton_attention,
    triton_unavailable_reason)
from mmpe.models.layers.box.box_rpb import BoxRPB

pytestmark = pytest.mark.skipif(
    not (interpreted() or torch.cuda.is_available()),
    reason='Triton kernels need CUDA or TRITON_INTERPRET=1')

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
# float32 inputs against the float64 reference: IEEE float32 products, an
# online softmax and float32 atomic bucket sums in another order than the
# reference's; a few ulp of values of size ~1-10
F32_TOL = dict(atol=5e-5, rtol=2e-4)
# bfloat16 / float16 inputs (8 / 11 bits of mantissa): the output and the
# gradients rounded to the dtype, P rounded before P V on the GPU; against
# the float64 reference of the same rounded inputs, relative to the largest
# value of each tensor
LOW_TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3}


# ---------------------------------------------------------------- reference
def _pair_buckets(term, view, other):
    """Bucket(s) of the pair (viewer, other) of ``term``: the extras for a
    skip token, else ``u * Sx + v`` (product) or ``u`` and ``offset + v``
    (cross) with ``u = rows[vy, oy]``, ``v = cols[vx, ox]``; a viewer off
    the grid (``query_grid`` False) sees from the origin."""
    w = term.cols.shape[1]
    if view < term.skip or other < term.skip:
        return list(term.extras)
    vy, vx = divmod(view - term.skip, w) if term.query_grid else (0, 0)
    oy, ox = divmod(other - term.skip, w)
    u, v = int(term.rows[vy, oy]), int(term.cols[vx, ox])
    if term.layout == 'product':
        return [u * term.col_buckets + v]
    offset = term.row_buckets if term.col_offset is None else term.col_offset
    return [u, offset + v]


def _one_hot(term, n_view, n_other, buckets):
    """(n_view, n_other, buckets) float64: 1 at each pair's bucket(s)."""
    hot = torch.zeros(n_view, n_other, buckets, dtype=torch.float64)
    for i in range(n_view):
        for j in range(n_other):
            for x in _pair_buckets(term, i, j):
                hot[i, j, x] += 1
    return hot


def _reference(q, k, v, mask, terms, dropout=None):
    """float64 ``softmax(q k^T + T + m) v (+ sum_j p_ij r_b(i, j))``, the
    probabilities times ``dropout`` (a dropout scale) where given."""
    q, k, v = q.double(), k.double(), v.double()
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    logits = q @ k.transpose(-1, -2)
    out_terms = []
    for t in terms:
        values = t.values.double()
        if t.on == 'k':  # T_ij = c_i[b(i, j)]
            hot = _one_hot(t, lq, lk, values.shape[-1])
            logits = logits + torch.einsum(
                'bhin,ijn->bhij', values.expand(b, h, lq, -1), hot)
        elif t.on == 'q':  # T_ij = c'_j[b(j, i)]
            hot = _one_hot(t, lk, lq, values.shape[-1])
            logits = logits + torch.einsum(
                'bhjn,jin->bhij', values.expand(b, h, lk, -1), hot)
        else:
            out_terms.append(t)
    if mask is not None:
        logits = logits + mask.double()
    p = logits.softmax(-1)
    if dropout is not None:
        p = p * dropout
    out = p @ v
    for t in out_terms:  # z_i += sum_j p_ij r[b(i, j)]
        table = t.values.double()
        hot = _one_hot(t, lq, lk, table.shape[-2])
        out = out + torch.einsum('bhij,ijn->bhin', p, hot) @ table
    return out


def _random_term(grid, layout, skip, broadcast, g, on='k', heads=3,
                 batch=2, queries=None, query_grid=True):
    """Random bucket tables and values: with skip tokens one extra bucket
    (product) or one per axis (cross) after the spatial ones, as iRPE lays
    them out; bias (``broadcast``) values (1, H, 1, nb); on values a
    (H, nb, 6) table."""
    h, w = grid
    n = skip + h * w
    sy, sx = (3, 4) if layout == 'product' else (2 * h - 1, 2 * w - 1)
    if layout == 'product':
        nb, extras, offset = sy * sx + 1, (sy * sx, ), None
    else:  # rows | row extra | cols | col extra
        offset = sy + 1
        nb, extras = offset + sx + 1, (sy, offset + sx)
    qh, qw = (h, w) if query_grid else (1, 1)
    rows = torch.randint(0, sy, (qh, h), generator=g)
    cols = torch.randint(0, sx, (qw, w), generator=g)
    length = (queries or n) if on == 'k' else n
    shape = (1, heads, 1, nb) if broadcast else (batch, heads, length, nb)
    if on == 'v':
        shape = (1 if broadcast else heads, nb, 6)
    values = torch.randn(shape, generator=g)
    return AxisValues(values, rows, cols, layout, sy, sx, offset, skip,
                      extras if skip else (), on, query_grid)


def _compare(terms, q, k, v, mask, g, dtype=torch.float32):
    """Kernel against the reference, output and every gradient."""
    leaves = [x.to(DEVICE, dtype).requires_grad_(True) for x in (q, k, v)]
    values = [t.values.to(DEVICE).requires_grad_(True) for t in terms]
    kterms = [t._replace(values=x, rows=t.rows.to(DEVICE),
                         cols=t.cols.to(DEVICE))
              for t, x in zip(terms, values)]
    out = triton_attention(*leaves, None if mask is None else
                           mask.to(DEVICE), kterms)
    assert out.dtype == dtype
    refs = [x.detach().cpu().double().requires_grad_(True)
            for x in leaves + values]
    ref = _reference(*refs[:3], mask, [
        t._replace(values=x) for t, x in zip(terms, refs[3:])])
    grad = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    got = [out] + list(torch.autograd.grad(out, leaves + values,
                                           grad.to(DEVICE, dtype)))
    want = [ref] + list(torch.autograd.grad(ref, refs, grad))
    for name, a, b in zip(['out', 'dq', 'dk', 'dv'] +
                          [f'd{t.on}-values' for t in terms], got, want):
        a = a.detach().cpu().double()
        if dtype == torch.float32:
            torch.testing.assert_close(a, b, **F32_TOL, msg=name)
        else:
            err = (a - b).abs().max() / b.abs().max()
            assert err < LOW_TOL[dtype], (name, float(err))


def _inputs(n, g, queries=None, dv=6, padded=True):
    q = torch.randn(2, 3, queries or n, 16, generator=g)
    k, v = (torch.randn(2, 3, n, d, generator=g) for d in (16, dv))
    mask = None
    if padded:  # the second image's last keys are padding, plus a float mask
        mask = torch.randn(2, 1, queries or n, n, generator=g)
        mask[1, :, :, -3:] = float('-inf')
    return q, k, v, mask


# ------------------------------------------------------------ the kernel
@pytest.mark.parametrize('grid', [(3, 5), (1, 7), (9, 8)])
@pytest.mark.parametrize('layout', ['product', 'cross'])
@pytest.mark.parametrize('skip', [0, 1, 2])
@pytest.mark.parametrize('ons', ['k', 'q', 'v', 'qkv'])
def test_kernel_equals_dense_reference(grid, layout, skip, ons):
    """Contextual terms on keys, queries, values (one and all three), skip
    tokens, grids that are not square (9 x 8 + skip: two blocks of 64
    rows and keys), padded keys and a float mask: output and the gradients
    of q, k, v and every term's values."""
    g = torch.Generator().manual_seed(sum(grid) + len(layout) + skip)
    n = skip + grid[0] * grid[1]
    base = _random_term(grid, layout, skip, False, g)
    terms = [base._replace(on=on, values=_random_term(
        grid, layout, skip, False, g, on=on).values) for on in ons]
    _compare(terms, *_inputs(n, g), g)


@pytest.mark.parametrize('layout', ['product', 'cross'])
@pytest.mark.parametrize('ons', ['k', 'q', 'qk'])
def test_kernel_bias_tables(layout, ons):
    """Bias terms: one row of values per head, broadcast over the batch
    and the tokens (their gradient summed over both)."""
    g = torch.Generator().manual_seed(7)
    base = _random_term((4, 5), layout, 1, True, g)
    terms = [base._replace(on=on, values=_random_term(
        (4, 5), layout, 1, True, g, on=on).values) for on in ons]
    _compare(terms, *_inputs(21, g), g)


@pytest.mark.parametrize('queries', [7, 70])
def test_kernel_queries_off_the_grid(queries):
    """A decoder's cross-attention: ``Q`` queries (not grid tokens) against
    a 5 x 6 key grid, a cross term of per-axis values (BoxRPB's form)."""
    g = torch.Generator().manual_seed(queries)
    term = _random_term((5, 6), 'cross', 0, False, g, queries=queries,
                        query_grid=False)
    _compare([term], *_inputs(30, g, queries=queries, dv=8), g)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('ons', ['k', 'qkv'])
def test_kernel_low_precision(dtype, ons):
    """bfloat16 / float16 inputs (statistics and sums in float32): the
    output in the dtype, close to the float64 reference of the same
    rounded inputs."""
    g = torch.Generator().manual_seed(11)
    base = _random_term((6, 7), 'product', 1, False, g)
    terms = [base._replace(on=on, values=_random_term(
        (6, 7), 'product', 1, False, g, on=on).values) for on in ons]
    _compare(terms, *_inputs(43, g, padded=False), g, dtype)


def test_kernel_refuses_two_terms_of_one_role():
    g = torch.Generator().manual_seed(0)
    term = _random_term((3, 4), 'product', 0, False, g)
    q = torch.randn(2, 3, 12, 16)
    with pytest.raises(ValueError, match='one term per `on`'):
        triton_attention(q, q, q, None, [term, term])


@pytest.mark.parametrize('dropout_p', [0.0, 0.2])
def test_custom_op_passes_opcheck(dropout_p):
    """``torch.library.opcheck``: schema, fake kernel, autograd
    registration of ``mmpe::triton_attention`` (with every role; with and
    without dropout, whose mask the seed fixes) and of its backward op."""
    g = torch.Generator().manual_seed(3)
    n = 1 + 3 * 4
    base = _random_term((3, 4), 'cross', 1, False, g)
    vk, vq = (torch.randn(2, 3, n, base.values.shape[-1], generator=g)
              for _ in range(2))
    q, k, v, mask = _inputs(n, g)
    mask = mask.expand(2, 3, n, n)
    layout = [0, base.row_buckets, base.col_buckets,
              base.row_buckets + 1, 1, *base.extras, 1]
    seed = torch.tensor([1234]) if dropout_p else None
    args = (q, k, v, mask, vk, vq, True, vk.shape[-1], base.rows, base.cols,
            layout, dropout_p, seed)
    leaves = [x.requires_grad_(True) for x in (q, k, v, vk, vq)]
    assert leaves
    torch.library.opcheck(torch.ops.mmpe.triton_attention, args)
    out, lse, sums = torch.ops.mmpe.triton_attention(*args)
    back = tuple(x.detach() if isinstance(x, torch.Tensor) else x for x in (
        torch.randn_like(out), torch.randn_like(sums), q, k, v, out, lse,
        sums, mask, vk, vq, base.rows, base.cols, layout, dropout_p, seed))
    torch.library.opcheck(torch.ops.mmpe.triton_attention_backward, back)


def test_compiled_call_is_one_graph():
    """``torch.compile(fullgraph=True)`` of a function around the kernel:
    one graph, the custom op as one node (no graph break), equal to the
    eager call."""
    g = torch.Generator().manual_seed(4)
    term = _random_term((4, 4), 'product', 1, False, g)
    q, k, v, mask = _inputs(17, g)

    def attention(q, k, v, mask, values):
        return triton_attention(q, k, v, mask, [term._replace(values=values)])

    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    compiled = torch.compile(attention, fullgraph=True, backend='aot_eager')
    out = compiled(q, k, v, mask, term.values)
    torch.testing.assert_close(out, attention(q, k, v, mask, term.values))
    assert not counts['graph_break'], dict(counts['graph_break'])


# ------------------------------------------------ through the attention core
def _settings():
    """Module settings of iRPE: contextual on k, q, v and all three, bias
    on k and q; product / cross; piecewise or clip index; class tokens."""
    out = []
    for mode, ons in (('contextual', ('k', 'q', 'v', 'qkv')),
                      ('bias', ('k', 'qk'))):
        for method in ('product', 'cross'):
            for on in ons:
                index = (dict(ratio=1.9) if on != 'q' else
                         dict(index='clip', max_distance=2))
                out.append((dict(mode=mode, method=method, init='xavier',
                                 shared_head=on == 'qk', **index), on,
                            1 if len(out) % 2 else 0))
    return out


def _attend(module, grid, skip, dtype, route_fused, monkeypatch):
    """Output and the gradients of q, k, v and every parameter of one
    call of ``module`` on ``DEVICE`` (``route_fused``: its ``'fused'``
    backend is the Triton kernel also on CPU, as on CUDA)."""
    if route_fused and DEVICE == 'cpu':  # the CUDA backend, interpreted
        monkeypatch.setattr(choice, 'fused_backend', lambda _: 'fused-cuda')
    g = torch.Generator().manual_seed(9)
    n = skip + grid[0] * grid[1]
    module = module.to(DEVICE, dtype)
    q, k, v = (torch.randn(2, 2, n, 8, generator=g).to(DEVICE, dtype)
               .requires_grad_(True) for _ in range(3))
    pad = torch.zeros(2, n, dtype=torch.bool, device=DEVICE)
    pad[1, -4:] = True
    out = module.attend(q, k, v, grid, pad)
    out.backward(torch.randn(out.shape, generator=g).to(DEVICE, dtype))
    monkeypatch.undo()
    grads = {n: p.grad for n, p in module.named_parameters()}
    return [out, q.grad, k.grad, v.grad], grads


def _assert_close_to(got, want):
    """float32 results against float64 ones: F32_TOL, its absolute part
    scaled by the tensor's largest value (a parameter's gradient sums the
    float32 rounding of every pair: the MLPs of BoxRPB reach ~100)."""
    pairs = list(zip(got[0], want[0]))
    assert got[1].keys() == want[1].keys() and want[1]
    pairs += [(got[1][name], want[1][name]) for name in want[1]]
    for a, b in pairs:
        b = b.cpu()
        scale = max(1.0, float(b.abs().max()))
        torch.testing.assert_close(a.double().cpu(), b, rtol=F32_TOL['rtol'],
                                   atol=F32_TOL['atol'] * scale)


@pytest.mark.parametrize('setting', _settings(),
                         ids=lambda s: f'{s[0]["mode"]}-{s[0]["method"]}-'
                         f'{s[1]}-skip{s[2]}')
def test_irpe_through_the_core_equals_explicit(setting, monkeypatch):
    """``PEAttention(attn_impl='fused')`` with the Triton kernel (float32)
    against ``'explicit'`` (float64), a 3 x 5 grid with padded keys:
    output and the gradients of q, k, v and the iRPE tables."""
    cfg, on, skip = setting
    torch.manual_seed(0)
    module = PEAttention(16, 2, rpe_cfg=cfg, rpe_on=on, skip=skip,
                         attn_impl='fused')
    explicit = PEAttention(16, 2, rpe_cfg=cfg, rpe_on=on, skip=skip,
                           attn_impl='explicit')
    explicit.load_state_dict(module.state_dict())
    got = _attend(module, (3, 5), skip, torch.float32, True, monkeypatch)
    want = _attend(explicit, (3, 5), skip, torch.float64, False, monkeypatch)
    _assert_close_to(got, want)


def test_decomposed_rel_pos_through_the_core_equals_explicit(monkeypatch):
    """ViTDet's decomposed relative position (tables for a 4 x 6 grid),
    Triton kernel against the explicit backend."""
    cfg = dict(input_size=(4, 6), init='trunc_normal')
    torch.manual_seed(0)
    module = PEAttention(16, 2, rel_pos_cfg=cfg, attn_impl='fused')
    explicit = PEAttention(16, 2, rel_pos_cfg=cfg, attn_impl='explicit')
    explicit.load_state_dict(module.state_dict())
    got = _attend(module, (4, 6), 0, torch.float32, True, monkeypatch)
    want = _attend(explicit, (4, 6), 0, torch.float64, False, monkeypatch)
    _assert_close_to(got, want)


def test_box_rpb_cross_attention_equals_explicit():
    """BoxRPB's term of a decoder cross-attention (Q = 10 queries, a 4 x 5
    key grid, padded keys): its per-axis values through the Triton kernel
    (float32) against ``CrossPEAttention(attn_impl='explicit')`` (float64);
    the gradients reach the MLPs."""
    torch.manual_seed(0)
    rpb = BoxRPB(num_heads=2)
    g = torch.Generator().manual_seed(1)
    boxes = torch.rand(2, 10, 4, generator=g)
    pad = torch.zeros(2, 20, dtype=torch.bool)
    pad[1, -5:] = True
    results = []
    for dtype in (torch.float32, torch.float64):
        rpb.zero_grad()
        mod = rpb.to(DEVICE, dtype)
        gq = torch.Generator().manual_seed(2)
        q, k, v = (torch.randn(2, 2, n, 8, generator=gq).to(DEVICE, dtype)
                   .requires_grad_(True) for n in (10, 20, 20))
        term = mod.term(boxes.to(DEVICE, dtype), pad.to(DEVICE), 4, 5)
        if dtype == torch.float32:
            mask = additive_mask(None, pad.to(DEVICE), q)
            out = triton_attention(q / 8**0.5, k, v, mask,
                                   [term.axis_values()])
        else:
            attn = CrossPEAttention(16, 2, attn_impl='explicit')
            out = attn.attend(q, k, v, (4, 5), pad.to(DEVICE), terms=[term])
        out.backward(torch.randn(out.shape, generator=gq).to(DEVICE, dtype))
        results.append(([out, q.grad, k.grad, v.grad], {
            n: p.grad.clone() for n, p in mod.named_parameters()}))
    _assert_close_to(*results)


# ------------------------------------------------------- the choice of it
def _cuda_request(terms, dtype=torch.float32, head_dim=16, dropout=0.0):
    """A request with what the reasons read of CUDA queries (device, dtype,
    shape; no GPU here)."""
    q = types.SimpleNamespace(device=torch.device('cuda'), dtype=dtype,
                              shape=(2, 2, 16, head_dim))
    return AttentionRequest(q, q, q, 1.0, list(terms), dropout_p=dropout)


def test_the_auto_rule_picks_it_on_cuda():
    """On CUDA 'auto' runs the fused kernel wherever it applies, in
    training and inference, whatever the memory (it holds no (L, L)
    tensor); where it does not apply the memory rule decides."""
    gib = 2**30
    for grad in (True, False):
        for values in (True, False):
            call = AttentionCall(4096, grad, values, 'cuda', 2, 6, 64, 2)
            for free in (None, gib, 80 * gib):
                assert auto_backend(call, False, True, free) == 'fused'
    call = AttentionCall(4096, True, False, 'cuda', 2, 6, 64, 2)
    assert auto_backend(call, False, False, gib) == 'chunked'
    assert backend_rule.auto_backend is auto_backend


def test_cuda_reasons_name_what_the_kernel_does_not_take():
    """The fallback's warning names why: a dtype, a head dim, a term
    without per-axis buckets, more class tokens than the kernel's skip tile
    (and attention dropout on CPU); None where it
    applies (Triton installed, dropout included); 'fused' is the Triton
    kernel on CUDA only."""
    assert triton_unavailable_reason(torch.device('cuda')) is None
    assert choice.fused_backend('cuda') == 'fused-cuda'
    assert choice.fused_backend('cpu') == 'fused-cpu'
    cuda, cpu = ATTENTION_BACKENDS['fused-cuda'], ATTENTION_BACKENDS[
        'fused-cpu']
    cfg = dict(mode='contextual', method='product', init='xavier')
    module = PEAttention(16, 2, rpe_cfg=cfg, rpe_on='k')
    qs = torch.randn(2, 2, 12, 8)
    terms = module.relative_terms(qs, None, 3, 4)
    for dtype in TRITON_DTYPES:
        assert cuda.reason(_cuda_request(terms, dtype)) is None
    assert 'float64' in cuda.reason(_cuda_request(terms, torch.float64))
    assert 'head dim 512' in cuda.reason(_cuda_request(terms, head_dim=512))
    assert cuda.reason(_cuda_request(terms, dropout=0.1)) is None
    assert 'dropout' in cpu.reason(AttentionRequest(qs, qs, qs, 1.0, terms,
                                                    dropout_p=0.1))
    plain = types.SimpleNamespace(axis_layout=None, axis_on='k')
    assert 'per-axis' in cuda.reason(_cuda_request(terms + [plain]))
    # the CPU kernel does not take queries off the grid, the Triton one does
    box = types.SimpleNamespace(axis_layout='cross', axis_on='k',
                                axis_query_grid=False, target='logits')
    assert 'off the grid' in cpu.reason(AttentionRequest(qs, qs, qs, 1.0,
                                                         [box]))
    assert cuda.reason(_cuda_request([box])) is None
    assert 'runs on CPU' in cpu.reason(_cuda_request(terms))
    # more leading (class) tokens than the kernel's skip tile holds
    many = types.SimpleNamespace(device=torch.device('cuda'),
                                 dtype=torch.float32, shape=(2, 2, 29, 16))
    assert 'leading (class) tokens' in cuda.reason(AttentionRequest(
        many, many, many, 1.0, terms, height=3, width=4))


def test_a_setting_it_does_not_take_falls_back_with_the_reason(monkeypatch):
    """The core on the CUDA path (the fused backend of CUDA, interpreted):
    attention dropout while training runs the Triton kernel; float64 (not
    taken) runs 'chunked' with a warning that names the dtype."""
    cfg = dict(mode='contextual', method='cross', init='xavier')
    module = PEAttention(16, 2, rpe_cfg=cfg, rpe_on='k', attn_drop=0.1,
                         attn_impl='fused')
    called = []
    monkeypatch.setattr(choice, 'fused_backend', lambda _: 'fused-cuda')
    monkeypatch.setattr(fused_cuda, 'triton_attention',
                        lambda q, k, v, mask, terms, p: called.append(p) or q)
    q = torch.randn(1, 2, 12, 8, requires_grad=True)
    module.attend(q, q, q, (3, 4))
    assert called == [0.1]
    with pytest.warns(UserWarning, match='falls back to the chunked backend'
                      '.*float64'):
        out = module.double().attend(q.double(), q.double(), q.double(),
                                     (3, 4))
    assert out.shape == q.shape and called == [0.1]


@pytest.mark.parametrize('ons', ['k', 'qkv'])
def test_kernel_attention_dropout(ons):
    """Attention dropout inside the kernel: the mask the call drew
    (:func:`dropout_mask` of the same seed, the global generator reset)
    applied to the reference's probabilities (the value term sees them
    dropped, as the explicit backend's): output and every gradient; about
    ``p`` of the pairs dropped."""
    g = torch.Generator().manual_seed(13)
    p = 0.3
    base = _random_term((6, 7), 'cross', 1, False, g)
    terms = [base._replace(on=on, values=_random_term(
        (6, 7), 'cross', 1, False, g, on=on).values) for on in ons]
    q, k, v, mask = _inputs(43, g)
    mask[1, :, :, -3:] = -1e4  # a finite mask: no 0 * inf in the reference
    leaves = [x.to(DEVICE).requires_grad_(True) for x in (q, k, v)]
    values = [t.values.to(DEVICE).requires_grad_(True) for t in terms]
    kterms = [t._replace(values=x, rows=t.rows.to(DEVICE),
                         cols=t.cols.to(DEVICE))
              for t, x in zip(terms, values)]
    torch.manual_seed(5)
    out = triton_attention(*leaves, mask.to(DEVICE), kterms, dropout_p=p)
    torch.manual_seed(5)  # the seed the call drew
    seed = torch.randint(2**31 - 1, (1, ))
    scale = dropout_mask(seed, p, 2, 3, 43, 43, DEVICE).cpu().double()
    kept = torch.tensor(1 / (1 - p), dtype=torch.float32).item()  # float32
    assert set(scale.unique().tolist()) == {0.0, kept}
    dropped = float((scale == 0).double().mean())
    assert abs(dropped - p) < 0.05, dropped  # 23 k draws: 0.05 is 16 sigma
    refs = [x.detach().cpu().double().requires_grad_(True)
            for x in leaves + values]
    ref = _reference(*refs[:3], mask, [
        t._replace(values=x) for t, x in zip(terms, refs[3:])],
        dropout=scale)
    grad = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    got = [out] + list(torch.autograd.grad(out, leaves + values,
                                           grad.to(DEVICE)))
    want = [ref] + list(torch.autograd.grad(ref, refs, grad))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.detach().cpu().double(), b, **F32_TOL)
