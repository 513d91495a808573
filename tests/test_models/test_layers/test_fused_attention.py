"""The fused CPU backend of the attention core (``attn_impl='fused'``,
mmpe's compiled kernel) and where the automatic choice takes it.

Expected values: a dense reference written here (the term gathered pair by
pair from the per-query values with the bucket tables, then softmax, with
autograd's gradients) for the kernel itself; a per-pair loop of the iRPE
paper's Eq. 13-16 with the buckets of its formulas (``pair_bucket`` of
test_irpe.py); and the explicit backend (checked against such loops in
test_irpe_attention.py and test_pe_attention.py) for every iRPE setting the
kernel reads. The decomposed relative position is checked against the
MViTv2 / ViTDet equations in test_rel_pos.py.
"""
import math
import warnings

import pytest
import torch

from mmpe.models.layers import AxisValues, PEAttention, RoPE2D, ViTAttention
from mmpe.models.layers.attention import core
from mmpe.models.layers.attention.backends import fused_cpu
from mmpe.models.layers.attention import fused as fused_module
from mmpe.models.layers.attention.fused import (fused_attention,
                                                fused_unavailable_reason)
from test_chunked_attention import _assert_same, _fwd_bwd, _inputs
from test_irpe import pair_bucket

# float64: the kernel and the references add the same terms in another order
F64_TOL = dict(atol=1e-10, rtol=1e-9)
# float32: the kernel's exp is Cephes' expf (about 1 ulp) and its sums run
# in another order than ATen's softmax; a few ulp of values of size ~1
F32_TOL = dict(atol=2e-5, rtol=1e-4)


def test_kernel_is_built():
    """``make test`` builds the kernel (setup.py): one that is missing
    fails here, as every test below."""
    assert fused_unavailable_reason() is None, fused_unavailable_reason()


def _settings():
    """Every setting the kernel reads: contextual on k, q, v and their
    combinations, bias on k, q and both; product / cross, shared or
    per-head tables, piecewise or clip index (rotating)."""
    out = []
    combos = [(mode, method, on) for mode, ons in (
        ('contextual', ('k', 'q', 'v', 'qk', 'kv', 'qkv')),
        ('bias', ('k', 'q', 'qk'))) for method in ('product', 'cross')
              for on in ons]
    indices = (dict(ratio=1.0), dict(ratio=1.9),
               dict(index='clip', max_distance=2))
    for i, (mode, method, on) in enumerate(combos):
        for shared in (False, True):
            out.append((dict(mode=mode, method=method, shared_head=shared,
                             init='xavier', **indices[i % 3]), on))
    return out


def _setting_id(setting):
    cfg, on = setting
    return (f"{cfg['mode']}-{cfg['method']}-{on}-"
            f"{'shared' if cfg['shared_head'] else 'perhead'}-"
            f"{cfg.get('index', 'piecewise')}{cfg.get('ratio', '')}")


def _core(impl, cfg, on='k', skip=0, **kwargs):
    torch.manual_seed(0)
    return PEAttention(8, 2, rpe_cfg=cfg, rpe_on=on, skip=skip,
                       attn_impl=impl, **kwargs).double()


class _Count:
    """Counts calls of the fused kernel through the attention core."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = fused_cpu.fused_attention

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(fused_cpu, 'fused_attention', counted)


# ---------------------------------------------------------------- kernel
def _pair_buckets(term, i, j):
    """Bucket(s) of the pair (viewer i, other j) of ``term``'s layout."""
    ww = term.cols.shape[0]
    skip = term.skip
    if i < skip or j < skip:
        return list(term.extras)
    iy, ix = divmod(i - skip, ww)
    jy, jx = divmod(j - skip, ww)
    u, v = int(term.rows[iy, jy]), int(term.cols[ix, jx])
    if term.layout == 'product':
        return [u * term.col_buckets + v]
    offset = term.row_buckets if term.col_offset is None else term.col_offset
    return [u, offset + v]


def _dense_reference(q, k, v, mask, terms):
    """The attention of iRPE's Eq. 16-17 with every pair's bucket(s) looked
    up one (i, j) at a time: ``T_ij = c_i[b(i, j)]`` (on keys), ``c'_j[b(j,
    i)]`` (on queries), ``z_i += sum_j p_ij r[b(i, j)]`` (on values)."""
    b, h, n, _ = q.shape
    logits = q @ k.transpose(-1, -2)
    by_on = {t.on: t for t in terms}
    rows = []
    for i in range(n):
        row = []
        for j in range(n):
            e = logits[:, :, i, j]
            if 'k' in by_on:
                c = by_on['k'].values.expand(b, h, n, -1)
                e = e + sum(c[:, :, i, x] for x in _pair_buckets(
                    by_on['k'], i, j))
            if 'q' in by_on:
                c = by_on['q'].values.expand(b, h, n, -1)
                e = e + sum(c[:, :, j, x] for x in _pair_buckets(
                    by_on['q'], j, i))
            row.append(e)
        rows.append(torch.stack(row, -1))
    e = torch.stack(rows, -2)
    if mask is not None:
        e = e + mask
    p = e.softmax(-1)
    out = p @ v
    if 'v' in by_on:
        table = by_on['v'].values.expand(h, -1, -1)  # (H, nb, dv)
        extra = torch.stack([
            torch.stack([
                sum(p[:, :, i, j, None] * sum(
                    table[None, :, x] for x in _pair_buckets(
                        by_on['v'], i, j)) for j in range(n))
                for i in range(n)
            ], 2)
        ], 0)[0]
        out = out + extra
    return out


def _random_term(grid, layout, skip, broadcast, g, dtype=torch.float64,
                 on='k'):
    """Random values and bucket tables; with skip tokens one extra bucket
    (two for cross) after the spatial ones, as iRPE lays them out. On
    values: a (3, buckets, 5) table (3 heads of 5 channels)."""
    h, w = grid
    n = skip + h * w
    sy, sx = (3, 4) if layout == 'product' else (2 * h - 1, 2 * w - 1)
    if layout == 'product':
        nb, extras, offset = sy * sx + 1, (sy * sx, ), None
    else:  # rows | row extra | cols | col extra
        offset = sy + 1
        nb, extras = offset + sx + 1, (sy, offset + sx)
    rows = torch.randint(0, sy, (h, h), generator=g)
    cols = torch.randint(0, sx, (w, w), generator=g)
    shape = (1, 3, 1, nb) if broadcast else (2, 3, n, nb)
    if on == 'v':
        shape = (1 if broadcast else 3, nb, 5)
    values = torch.randn(shape, generator=g, dtype=dtype)
    return AxisValues(values, rows, cols, layout, sy, sx, offset, skip,
                      extras if skip else (), on)


@pytest.mark.parametrize('grid', [(3, 5), (4, 4), (1, 7), (6, 2)])
@pytest.mark.parametrize('layout', ['product', 'cross'])
@pytest.mark.parametrize('skip', [0, 1, 2])
@pytest.mark.parametrize('ons', ['k', 'q', 'v', 'qkv'])
@pytest.mark.parametrize('block', [8, None], ids=['blocks-of-8', 'auto'])
@pytest.mark.parametrize('broadcast', [False, True],
                         ids=['per-token', 'bias'])
def test_kernel_equals_dense_reference(grid, layout, skip, ons, block,
                                       broadcast):
    """Random values and bucket tables of the terms on keys, queries and
    values (one at a time and all three), skip tokens, padded keys, an
    extra float mask; blocks of 8 query rows (never dividing L) or the
    automatic blocks (one here): output and the gradients of q, k, v and
    every term's values (summed over a broadcast)."""
    g = torch.Generator().manual_seed(sum(grid) + len(layout) + skip)
    n = skip + grid[0] * grid[1]
    # one geometry, terms of it
    base = _random_term(grid, layout, skip, broadcast, g)
    terms = [
        base._replace(on=on, values=_random_term(
            grid, layout, skip, broadcast, g, on=on).values) for on in ons
    ]
    q, k, v = (torch.randn(2, 3, n, 5, generator=g, dtype=torch.float64)
               for _ in range(3))
    mask = torch.randn(n, n, generator=g, dtype=torch.float64)
    mask = mask[None, None].repeat(2, 1, 1, 1)
    mask[1, :, :, -3:] = float('-inf')  # padded keys of the second image
    leaves = [t.clone().requires_grad_(True)
              for t in [q, k, v] + [t.values for t in terms]]
    out = fused_attention(
        *leaves[:3], mask,
        [t._replace(values=x) for t, x in zip(terms, leaves[3:])],
        block_rows=block)
    refs = [t.clone().requires_grad_(True)
            for t in [q, k, v] + [t.values for t in terms]]
    ref = _dense_reference(
        *refs[:3], mask,
        [t._replace(values=x) for t, x in zip(terms, refs[3:])])
    torch.testing.assert_close(out, ref, **F64_TOL)
    grad = torch.randn(out.shape, generator=g, dtype=out.dtype)
    out.backward(grad)
    ref.backward(grad)
    for a, b in zip(leaves, refs):
        torch.testing.assert_close(a.grad, b.grad, **F64_TOL)


@pytest.mark.parametrize('ons', ['k', 'qkv'])
def test_kernel_on_head_views_of_a_fused_projection(ons):
    """q, k, v as the strided head views of one (B, L, 3, H, D) projection
    (as the ViT and DETR layers split them; the forward copies them whole,
    the backward one head at a time): the dense reference, forward and
    backward."""
    g = torch.Generator().manual_seed(5)
    grid, n = (4, 5), 20
    base = _random_term(grid, 'product', 0, False, g)
    terms = [base._replace(on=on, values=_random_term(
        grid, 'product', 0, False, g, on=on).values) for on in ons]
    qkv = torch.randn(2, n, 3, 3, 5, generator=g, dtype=torch.float64)
    grad = torch.randn(2, 3, n, 5, generator=g, dtype=torch.float64)
    results = []
    for attention in (fused_attention, _dense_reference):
        qkv_leaf = qkv.clone().requires_grad_(True)
        values = [t.values.clone().requires_grad_(True) for t in terms]
        q, k, v = qkv_leaf.permute(2, 0, 3, 1, 4).unbind(0)
        assert not q.is_contiguous()
        out = attention(q, k, v, None, [
            t._replace(values=x) for t, x in zip(terms, values)])
        out.backward(grad)
        results.append([out.detach(), qkv_leaf.grad] + [x.grad for x in values])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **F64_TOL)


def test_kernel_refuses_bucket_ids_out_of_range():
    g = torch.Generator().manual_seed(0)
    term = _random_term((3, 4), 'product', 0, False, g)
    q = torch.randn(2, 3, 12, 5, dtype=torch.float64)
    bad = term._replace(rows=term.rows + term.row_buckets)
    with pytest.raises(RuntimeError, match='bucket ids out of range'):
        fused_attention(q, q, q, None, [bad])
    with pytest.raises(ValueError, match='one term per `on`'):
        fused_attention(q, q, q, None, [term, term])


def test_kernel_float32_close_to_float64():
    """float32 (the vectorised exp) against the same inputs in float64."""
    g = torch.Generator().manual_seed(3)
    h, w = 9, 11
    n = h * w
    rows = torch.randint(0, 7, (h, h), generator=g)
    cols = torch.randint(0, 7, (w, w), generator=g)
    q, k, v = (torch.randn(2, 4, n, 16, generator=g, dtype=torch.float64)
               for _ in range(3))
    values = torch.randn(2, 4, n, 49, generator=g, dtype=torch.float64)
    outs, grads = [], []
    for dtype in (torch.float64, torch.float32):
        leaves = [t.to(dtype).detach().requires_grad_(True)
                  for t in (q, k, v, values)]
        out = fused_attention(*leaves[:3], None, [
            AxisValues(leaves[3], rows, cols, 'product', 7, 7)
        ])
        out.backward(torch.ones_like(out))
        outs.append(out.detach().double())
        grads.append([t.grad.double() for t in leaves])
    torch.testing.assert_close(outs[1], outs[0], **F32_TOL)
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b, **F32_TOL)


def test_custom_ops_pass_opcheck():
    """Schema, fake (meta) kernels, autograd registration and dispatch of
    mmpe::fused_attention and its backward (torch.library.opcheck)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 12, 4, generator=g) for _ in range(3))
    values = torch.randn(2, 2, 12, 9, generator=g, requires_grad=True)
    rows = torch.randint(0, 3, (3, 3), generator=g)
    cols = torch.randint(0, 3, (4, 4), generator=g)
    mask = torch.zeros(2, 1, 1, 12)
    values_q = torch.randn(2, 2, 12, 9, generator=g)
    layout = [1, 3, 3, 3, 0, -1, -1]  # product 3 x 3, no skip tokens
    for with_sums in (False, True):
        args = (q.requires_grad_(), k, v, mask, values, values_q, with_sums,
                9, rows, cols, layout, 0, 5, '')  # blocks of 5 rows,
        # the process's kernel variant
        torch.library.opcheck(torch.ops.mmpe.fused_attention.default, args)
        out, lse, sums = torch.ops.mmpe.fused_attention(*args)
        torch.library.opcheck(
            torch.ops.mmpe.fused_attention_backward.default,
            (torch.randn_like(out),
             torch.randn_like(sums) if with_sums else None, q.detach(), k, v,
             out.detach(), lse.detach(), mask, values.detach(), values_q,
             9, rows, cols, layout, 0, 5, ''))


# --------------------------------------------------------- attention core
@pytest.mark.parametrize('setting', _settings(), ids=_setting_id)
@pytest.mark.parametrize('grid,skip', [((3, 5), 0), ((5, 3), 1), ((3, 5), 2)])
def test_fused_equals_explicit_forward_backward(setting, grid, skip,
                                                monkeypatch):
    """Every setting the kernel reads, with 0, 1 or 2 class tokens and a
    padded image in the batch: output, the gradients of q, k, v and of
    every table."""
    cfg, on = setting
    count = _Count(monkeypatch)
    want = _fwd_bwd(_core('explicit', cfg, on, skip), skip, grid=grid)
    got = _fwd_bwd(_core('fused', cfg, on, skip), skip, grid=grid)
    assert count.calls == 1
    _assert_same(got, want)


def test_fused_matches_a_loop_reference():
    """Contextual product iRPE on keys with per-head tables and padded
    keys, against Eq. 13-16 written one (b, h, i, j) at a time."""
    cfg = dict(mode='contextual', method='product', ratio=1.9,
               shared_head=False, init='xavier')
    grid = (4, 6)
    core = _core('fused', cfg)
    q, k, v, mask = _inputs(0, grid)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = core.attend(*leaves, grid, mask)
    table = core.rpe_k.table.detach().clone().requires_grad_(True)
    refs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    qr, kr, vr = refs
    bs, heads, n, d = q.shape
    scale = 1 / math.sqrt(d)
    rows = []
    for b in range(bs):
        for h in range(heads):
            for i in range(n):
                logits = []
                for j in range(n):
                    (bucket, ) = pair_bucket(core.rpe_k, *grid, i, j)
                    e = (qr[b, h, i] * scale) @ (kr[b, h, j] + table[h, bucket])
                    logits.append(e - math.inf if mask[b, j] else e)
                rows.append(torch.stack(logits).softmax(0) @ vr[b, h])
    ref = torch.stack(rows).view(bs, heads, n, d)
    torch.testing.assert_close(out, ref, **F64_TOL)
    grad = torch.randn(out.shape, dtype=out.dtype)
    out.backward(grad)
    ref.backward(grad)
    for a, b in zip(leaves + [core.rpe_k.table], refs + [table]):
        torch.testing.assert_close(a.grad, b.grad, **F64_TOL)


def test_fused_with_rope_and_attn_mask_equals_explicit(monkeypatch):
    """RoPE rotates q and k for the logits while iRPE reads them unrotated,
    and a float (L, L) ``attn_mask`` joins the key padding mask."""
    count = _Count(monkeypatch)
    cfg = dict(mode='contextual', method='cross', ratio=1.0, init='xavier')
    rope = RoPE2D(4)((3, 5), torch.device('cpu'), torch.float64)
    attn_mask = torch.randn(15, 15, generator=torch.Generator().manual_seed(
        9), dtype=torch.float64)
    want = _fwd_bwd(_core('explicit', cfg), 0, attn_mask, rope=rope)
    got = _fwd_bwd(_core('fused', cfg), 0, attn_mask, rope=rope)
    assert count.calls == 1
    _assert_same(got, want)


def test_vit_layout_fused_equals_explicit():
    """ViTAttention (heads split from the qkv projection: strided q, k, v)
    with 'fused' equals 'explicit', every weight's gradient included."""
    torch.manual_seed(0)
    kwargs = dict(rpe_on='k', rpe_cfg=dict(
        mode='contextual', method='product', ratio=1.0, init='xavier'))
    explicit = ViTAttention(16, 2, attn_impl='explicit', **kwargs).double()
    fused = ViTAttention(16, 2, attn_impl='fused', **kwargs).double()
    fused.load_state_dict(explicit.state_dict())
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    grads = []
    for m in (explicit, fused):
        m(x, (3, 4)).square().sum().backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], **F64_TOL)


def _saved_shapes(core, grid):
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    q, k, v, mask = (t.float() if t.is_floating_point() else t
                     for t in _inputs(0, grid))
    q.requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        core.float().attend(q, k, v, grid, mask).sum().backward()
    return shapes


def test_fused_keeps_no_square_tensor_for_the_backward():
    """What lives between forward and backward: q, k, v, the output, the
    rows' log-sum-exp, the mask, the lookups and the per-axis tables."""
    cfg = dict(mode='contextual', method='product', ratio=1.0, init='xavier')
    grid = (5, 6)
    n = grid[0] * grid[1]
    shapes = _saved_shapes(_core('fused', cfg), grid)
    assert (2, 2, n) in shapes  # the log-sum-exp: the kernel ran
    assert not [s for s in shapes if s[-2:] == (n, n)], shapes
    assert [s for s in _saved_shapes(_core('explicit', cfg), grid)
            if s[-2:] == (n, n)]


@pytest.mark.parametrize('on,skip,cfg,reason', [
    ('k', 0, dict(method='euclidean'), 'per-axis buckets'),
    ('qkv', 1, dict(method='quant'), 'per-axis buckets'),
])
def test_settings_outside_the_kernel_fall_back_to_chunked(
        on, skip, cfg, reason, monkeypatch):
    """attn_impl='fused' where the kernel does not apply: one warning that
    says why, and the chunked backend's results."""
    count = _Count(monkeypatch)
    cfg = dict(mode='contextual', ratio=1.0, init='xavier', **cfg)
    want = _fwd_bwd(_core('chunked', cfg, on, skip), skip)
    core = _core('fused', cfg, on, skip)
    with pytest.warns(UserWarning, match=f"'fused' falls back.*{reason}"):
        got = _fwd_bwd(core, skip)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # once per module
        _fwd_bwd(core, skip)
    assert count.calls == 0
    _assert_same(got, want)


def test_dropout_and_dtype_fall_back():
    cfg = dict(mode='contextual', method='product', ratio=1.0)
    q = torch.randn(1, 2, 12, 4)
    drop = PEAttention(8, 2, attn_drop=0.1, rpe_cfg=cfg).train()
    terms = drop.relative_terms(q, None, 3, 4)
    assert 'dropout' in drop._fused_reason(q, terms)
    assert drop.eval()._fused_reason(q, terms) is None
    for half in (torch.bfloat16, torch.float16):  # computed in float32
        low = q.to(half)
        assert drop._fused_reason(low, drop.relative_terms(low, None, 3,
                                                           4)) is None
    assert 'float8_e4m3fn' in drop._fused_reason(
        q.to(torch.float8_e4m3fn), terms)


def test_auto_rule_on_cpu():
    """On CPU 'auto' takes the kernel where it applies, at every length, in
    training and inference; elsewhere the rule of the other backends holds.
    """
    cfg = dict(mode='contextual', method='product')
    core = PEAttention(8, 2, rpe_cfg=cfg)
    for length in (16, 196, 1050, 4096, 8192):
        assert core.select_backend(length, True, fused_ok=True) == 'fused'
        assert core.select_backend(length, False, fused_ok=True) == 'fused'
    assert core.select_backend(16, False, fused_ok=False) == 'sdpa'
    assert core.select_backend(16, True, fused_ok=False) == 'explicit'
    assert core.select_backend(4096, True, fused_ok=False) == 'chunked'
    named = PEAttention(8, 2, rpe_cfg=cfg, attn_impl='fused')
    assert named.select_backend(16, False, fused_ok=True) == 'fused'
    assert named.select_backend(16, True, fused_ok=False) == 'chunked'
    for impl in ('explicit', 'chunked', 'sdpa'):  # never by another name
        other = PEAttention(8, 2, rpe_cfg=cfg, attn_impl=impl)
        assert other.select_backend(4096, True, fused_ok=True) == impl


def test_auto_runs_the_kernel(monkeypatch):
    """In training and in inference, equal to the explicit backend (SDPA
    with the terms as a constant mask, without gradients)."""
    count = _Count(monkeypatch)
    cfg = dict(mode='contextual', method='product', ratio=1.0, init='xavier')
    core = _core('auto', cfg)
    _assert_same(_fwd_bwd(core, 0), _fwd_bwd(_core('explicit', cfg), 0))
    assert count.calls == 1
    q, k, v, mask = _inputs(0)
    with torch.no_grad():
        got = core.attend(q, k, v, (3, 5), mask)
        want = _core('explicit', cfg).attend(q, k, v, (3, 5), mask)
    assert count.calls == 2
    torch.testing.assert_close(got, want, **F64_TOL)


def test_without_the_kernel_the_other_backends_run(monkeypatch):
    """An installation without the compiled kernel: 'auto' keeps the
    earlier rule and 'fused' falls back to chunked, naming why."""
    monkeypatch.setattr(fused_cpu, 'fused_unavailable_reason',
                        lambda: 'the compiled kernel mmpe._ext is not built')
    count = _Count(monkeypatch)
    cfg = dict(mode='contextual', method='product', ratio=1.0, init='xavier')
    want = _fwd_bwd(_core('explicit', cfg), 0)
    assert count.calls == 0
    _assert_same(_fwd_bwd(_core('auto', cfg), 0), want)
    with pytest.warns(UserWarning, match='mmpe._ext is not built'):
        got = _fwd_bwd(_core('fused', cfg), 0)
    assert count.calls == 0
    _assert_same(got, want)
    assert fused_module.fused_unavailable_reason() is None  # the real one


def test_kernel_in_parallel_equals_serial():
    """Two intra-op threads (the forward splits (image, head, block), the
    backward (image, head)) give what one thread gives, bit for bit."""
    g = torch.Generator().manual_seed(11)
    terms = [
        _random_term((5, 6), 'product', 1, False, g, on=on)
        for on in ('k', 'q', 'v')
    ]
    terms = [terms[0]] + [
        terms[0]._replace(on=t.on, values=t.values) for t in terms[1:]
    ]
    q, k, v = (torch.randn(2, 3, 31, 5, generator=g, dtype=torch.float64)
               for _ in range(3))
    grad = torch.randn(2, 3, 31, 5, generator=g, dtype=torch.float64)
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            leaves = [t.clone().requires_grad_(True)
                      for t in [q, k, v] + [t.values for t in terms]]
            out = fused_attention(
                *leaves[:3], None,
                [t._replace(values=x) for t, x in zip(terms, leaves[3:])],
                block_rows=8)
            out.backward(grad)
            results.append([out.detach()] + [t.grad for t in leaves])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)
