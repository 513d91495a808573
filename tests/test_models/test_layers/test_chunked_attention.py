"""The chunked backend of the attention core and the automatic choice.

Expected values: the explicit backend (checked against per-pair loops in
test_irpe_attention.py and test_pe_attention.py) for every iRPE setting,
and, for the three terms at once, a per-pair loop written here with the
buckets of the paper's formulas (``pair_bucket`` of test_irpe.py).
"""
import math

import pytest
import torch

from mmpe.models.layers import (PEAttention, RelativeTerm, RoPE2D,
                                ViTAttention, register_term)
from mmpe.models.layers.attention.backend_rule import AUTO_CHUNKED_FROM
from mmpe.models.layers.attention.chunked import chunk_rows
from test_irpe import pair_bucket

# float64 throughout: the backends add the same terms in another order
F64_TOL = dict(atol=1e-10, rtol=1e-9)
# a 3 x 5 grid with 0, 1 or 2 skip tokens: 15, 16 or 17 tokens, none a
# multiple of the chunk, and at least three chunks
GRID, CHUNK = (3, 5), 6


def _settings():
    """Every (mode, method, on) with rotating index, table sharing and
    skip tokens."""
    out = []
    combos = [(mode, method, on) for mode, ons in (
        ('contextual', ('k', 'q', 'v', 'qk', 'qkv')), ('bias', ('k', 'q',
                                                             'qk')))
              for method in ('product', 'cross', 'euclidean', 'quant')
              for on in ons]
    for i, (mode, method, on) in enumerate(combos):
        index = (dict(index='clip', max_distance=2) if i % 3 == 2 else dict(
            ratio=1.0))
        out.append((dict(mode=mode, method=method, shared_head=bool(i % 2),
                         init='xavier', **index), on, i % 3))
    return out


SETTINGS = _settings()


def _setting_id(setting):
    cfg, on, skip = setting
    return (f"{cfg['mode']}-{cfg['method']}-{on}-skip{skip}-"
            f"{'shared' if cfg['shared_head'] else 'perhead'}-"
            f"{cfg.get('index', 'piecewise')}")


def _core(impl, cfg, on, skip, chunk_size=CHUNK):
    torch.manual_seed(0)
    return PEAttention(8, 2, rpe_cfg=cfg, rpe_on=on, skip=skip,
                       attn_impl=impl, chunk_size=chunk_size).double()


def _inputs(skip, grid=GRID, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = skip + grid[0] * grid[1]
    q, k, v = (torch.randn(2, 2, n, 4, generator=g, dtype=torch.float64)
               for _ in range(3))
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, -4:] = True  # the second image's last keys are padding
    return q, k, v, mask


def _fwd_bwd(core, skip, attn_mask=None, grid=GRID, rope=None):
    """Output and the gradients of q, k, v and every table."""
    q, k, v, mask = (t.clone() for t in _inputs(skip, grid))
    for t in (q, k, v):
        t.requires_grad_(True)
    out = core.attend(q, k, v, grid, mask, attn_mask, rope)
    g = torch.Generator().manual_seed(2)
    out.backward(torch.randn(out.shape, generator=g, dtype=out.dtype))
    tables = {n: p.grad.clone() for n, p in core.named_parameters()}
    return out.detach(), (q.grad, k.grad, v.grad), tables


def _assert_same(got, want):
    torch.testing.assert_close(got[0], want[0], **F64_TOL)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, **F64_TOL)
    assert got[2].keys() == want[2].keys() and got[2]
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], **F64_TOL,
                                   msg=name)


@pytest.mark.parametrize('setting', SETTINGS, ids=_setting_id)
def test_chunked_equals_explicit_forward_backward(setting):
    cfg, on, skip = setting
    want = _fwd_bwd(_core('explicit', cfg, on, skip), skip)
    got = _fwd_bwd(_core('chunked', cfg, on, skip), skip)
    _assert_same(got, want)


@pytest.mark.parametrize('chunk_size', [1, 4, 17, 100])
@pytest.mark.parametrize('on', ['qkv', 'qk'])
def test_chunk_sizes_and_attn_mask(chunk_size, on):
    """One-row chunks, one chunk, and a float (L, L) ``attn_mask`` (whose
    rows are sliced with the chunk), with a class token."""
    cfg = dict(mode='contextual', method='product', ratio=1.0,
               shared_head=False, init='xavier')
    g = torch.Generator().manual_seed(5)
    attn_mask = torch.randn(16, 16, generator=g, dtype=torch.float64)
    attn_mask[3, 7] = float('-inf')
    want = _fwd_bwd(_core('explicit', cfg, on, 1), 1, attn_mask)
    got = _fwd_bwd(_core('chunked', cfg, on, 1, chunk_size), 1, attn_mask)
    _assert_same(got, want)


def test_chunked_with_rope_equals_explicit():
    """RoPE rotates q and k for the logits; iRPE still reads them
    unrotated (the lookups are computed outside the chunked op)."""
    cfg = dict(mode='contextual', method='cross', ratio=1.0, init='xavier')
    rope = RoPE2D(4)(GRID, torch.device('cpu'), torch.float64)
    want = _fwd_bwd(_core('explicit', cfg, 'qk', 0), 0, rope=rope)
    got = _fwd_bwd(_core('chunked', cfg, 'qk', 0), 0, rope=rope)
    _assert_same(got, want)


def _assert_fwd_bwd(out, ref, leaves, ref_leaves, tables, ref_tables):
    """``out == ref``, and after one random backward through each, equal
    gradients of the inputs and of the tables."""
    torch.testing.assert_close(out, ref, **F64_TOL)
    grad = torch.randn(out.shape, dtype=out.dtype)
    out.backward(grad)
    ref.backward(grad)
    for got, want in zip(leaves + tables, ref_leaves + ref_tables):
        torch.testing.assert_close(got.grad, want.grad, **F64_TOL)


def _loop_attention(q, k, v, mask, tables, grid, skip):
    """Eq. 13-17 of the iRPE paper, one (batch, head, i, j) at a time.

    ``tables`` maps 'q' / 'k' / 'v' to (module, table); contextual product
    tables per head (H, nb, d); buckets from the paper's formulas.
    """
    bs, heads, n, d = q.shape
    scale = 1 / math.sqrt(d)
    out = []
    for b in range(bs):
        per_head = []
        for h in range(heads):
            rows = []
            for i in range(n):
                logits = []
                for j in range(n):
                    e = (q[b, h, i] * scale) @ k[b, h, j]
                    rpe, table = tables['k']
                    (bk, ) = pair_bucket(rpe, *grid, i, j)
                    e = e + (q[b, h, i] * scale) @ table[h, bk]
                    rpe, table = tables['q']
                    (bq, ) = pair_bucket(rpe, *grid, j, i)  # seen from key j
                    e = e + (k[b, h, j] * scale) @ table[h, bq]
                    if mask[b, j]:
                        e = e * 0 + float('-inf')
                    logits.append(e)
                p = torch.stack(logits).softmax(0)
                rpe, table = tables['v']
                z = sum(p[j] * (v[b, h, j] + table[h, pair_bucket(
                    rpe, *grid, i, j)[0]]) for j in range(n))
                rows.append(z)
            per_head.append(torch.stack(rows))
        out.append(torch.stack(per_head))
    return torch.stack(out)


def test_chunked_matches_a_loop_reference():
    """iRPE on q, k and v at once (per-head contextual product), a class
    token and padded keys: forward and backward against the loops."""
    cfg = dict(mode='contextual', method='product', ratio=1.0,
               shared_head=False, init='xavier')
    skip, grid = 1, (2, 3)
    core = _core('chunked', cfg, 'qkv', skip, chunk_size=3)
    q, k, v, mask = _inputs(skip, grid)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = core.attend(*leaves, grid, mask)
    tabs = {
        letter: getattr(core, f'rpe_{letter}').table.detach().clone()
        .requires_grad_(True)
        for letter in 'qkv'
    }
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = _loop_attention(*ref_leaves, mask, {
        letter: (getattr(core, f'rpe_{letter}'), tabs[letter])
        for letter in 'qkv'
    }, grid, skip)
    _assert_fwd_bwd(out, ref, leaves, ref_leaves,
                    [getattr(core, f'rpe_{c}').table for c in 'qkv'],
                    [tabs[c] for c in 'qkv'])


def _saved_shapes(core, skip, grid, no_grad=False):
    """Shapes of the tensors autograd saves for the backward of one call."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    q, k, v, mask = (t.float() if t.is_floating_point() else t
                     for t in _inputs(skip, grid))
    q.requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        core.float().attend(q, k, v, grid, mask).sum().backward()
    return shapes


@pytest.mark.parametrize('on', ['k', 'qkv'])
def test_chunked_keeps_no_square_tensor_for_the_backward(on):
    """What lives between forward and backward is q, k, v, the output and
    the terms' (B, H, L, nb) lookups or tables: no (L, L) tensor. The
    explicit backend, by contrast, keeps the (B, H, L, L) probabilities."""
    cfg = dict(mode='contextual', method='product', ratio=1.0, init='xavier')
    n = GRID[0] * GRID[1]
    square = lambda shapes: [s for s in shapes if s[-2:] == (n, n)]  # noqa
    assert not square(_saved_shapes(_core('chunked', cfg, on, 0), 0, GRID))
    assert square(_saved_shapes(_core('explicit', cfg, on, 0), 0, GRID))


def test_auto_rule():
    """The documented rule of attn_impl='auto' (select_backend) where the
    fused CPU kernel does not apply (``fused_ok=False``: CUDA, settings
    outside the kernel; test_fused_attention.py has the rest)."""
    cfg = dict(mode='contextual', method='product')
    short, long = AUTO_CHUNKED_FROM - 1, AUTO_CHUNKED_FROM
    core = PEAttention(8, 2, rpe_cfg=cfg, rpe_on='k')
    assert core.attn_impl == 'auto'
    # training: explicit below the threshold, chunked from it on
    assert core.select_backend(short, needs_grad=True) == 'explicit'
    assert core.select_backend(long, needs_grad=True) == 'chunked'
    assert core.select_backend(8192, needs_grad=True) == 'chunked'
    # FlexAttention applicable: never in training (its backward failed to
    # compile for most settings on an H100; backend_rule)
    assert core.select_backend(long, True, flex_ok=True) == 'chunked'
    assert core.select_backend(short, True, flex_ok=True) == 'explicit'
    # inference: the terms as a constant mask of SDPA at any length
    assert core.select_backend(short, needs_grad=False) == 'sdpa'
    assert core.select_backend(8192, needs_grad=False) == 'sdpa'
    # iRPE on values needs the probabilities even without a gradient
    core_v = PEAttention(8, 2, rpe_cfg=cfg, rpe_on='kv')
    assert core_v.select_backend(short, needs_grad=False) == 'explicit'
    assert core_v.select_backend(long, needs_grad=False) == 'chunked'
    assert core_v.select_backend(long, True, flex_ok=True) == 'chunked'
    # attention dropout changes nothing (chunked redraws its masks; flex is
    # not applicable then, which the caller's flex_ok says)
    drop = PEAttention(8, 2, attn_drop=0.1, rpe_cfg=cfg).train()
    assert drop.select_backend(short, needs_grad=True) == 'explicit'
    assert drop.select_backend(long, needs_grad=True) == 'chunked'
    # named backends are what they say; no iRPE is always SDPA
    for impl in ('explicit', 'chunked', 'sdpa', 'flex'):
        named = PEAttention(8, 2, rpe_cfg=cfg, attn_impl=impl)
        assert named.select_backend(long, needs_grad=True) == impl
    assert named.select_backend(short, needs_grad=False) == 'flex'
    assert PEAttention(8, 2).select_backend(long, True) == 'sdpa'


def test_auto_runs_what_it_selects():
    """For a term outside the fused CPU kernel (the euclidean method; see
    test_fused_attention.py for the kernel's settings): at
    AUTO_CHUNKED_FROM tokens a training call keeps no (L, L) tensor
    (chunked); just below it keeps the probabilities (explicit)."""
    cfg = dict(mode='contextual', method='euclidean', ratio=1.0)
    long_grid = (32, AUTO_CHUNKED_FROM // 32)  # exactly the threshold
    short_grid = (1, AUTO_CHUNKED_FROM - 1)
    for grid, chunked in ((long_grid, True), (short_grid, False)):
        core = PEAttention(4, 1, rpe_cfg=cfg)
        n = grid[0] * grid[1]
        square = [s for s in _saved_shapes(core, 0, grid) if s[-2:] == (n, n)]
        assert bool(square) != chunked, grid


def test_vit_layout_chunked_equals_default():
    """ViTAttention (timm layout, as the CPVT backbone blocks) with
    'chunked' equals the default layer (explicit at this length), the
    gradients of every weight included."""
    torch.manual_seed(0)
    kwargs = dict(rpe_on='qk', skip=1, rpe_cfg=dict(
        mode='contextual', method='product', ratio=1.0, init='xavier'))
    default = ViTAttention(16, 2, **kwargs).double()
    chunked = ViTAttention(16, 2, attn_impl='chunked', chunk_size=5,
                           **kwargs).double()
    chunked.load_state_dict(default.state_dict())
    x = torch.randn(2, 1 + 12, 16, dtype=torch.float64)
    grads = []
    for m in (default, chunked):
        out = m(x, (3, 4))
        out.square().sum().backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], **F64_TOL)


@pytest.mark.parametrize('batch_heads,length,size,rows', [
    (6, 4096, 0, 64),  # ViT-S, batch 1, 64 x 64 tokens
    (16, 8192, 0, 32),  # 2**22 elements at most
    (12, 50, 0, 50),  # never more rows than tokens
    (1, 2**24, 0, 16),  # at least 16 rows
    (12, 4096, 7, 7),  # as asked
])
def test_chunk_rows(batch_heads, length, size, rows):
    assert chunk_rows(batch_heads, length, size) == rows


def test_bf16_autocast_close_to_fp32():
    """Under CPU autocast the chunked backend runs in bfloat16 like the
    explicit one and stays close to float32."""
    cfg = dict(mode='contextual', method='product', ratio=1.0, init='xavier')
    torch.manual_seed(0)
    layer = ViTAttention(32, 4, rpe_on='qkv', attn_impl='chunked',
                         chunk_size=5, rpe_cfg=cfg)
    x = torch.randn(2, 20, 32, requires_grad=True)
    ref = layer(x, (4, 5))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = layer(x, (4, 5))
    assert out.dtype == torch.bfloat16
    # bf16 keeps 8 mantissa bits: ~0.4% per rounding, a few roundings deep
    scale = float(ref.detach().abs().max())
    torch.testing.assert_close(out.float(), ref.detach(), rtol=0,
                               atol=3e-2 * scale)
    out.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize('impl', ['explicit', 'chunked'])
def test_all_padded_row_matches(impl):
    """A batch item with every key but the first padded: still finite and
    equal across backends (no division by an empty row)."""
    cfg = dict(mode='bias', method='euclidean', ratio=1.0, init='xavier')
    core = _core(impl, cfg, 'qk', 0)
    q, k, v, _ = _inputs(0)
    mask = torch.ones(2, 15, dtype=torch.bool)
    mask[:, 0] = False
    out = core.attend(q, k, v, GRID, mask)
    assert torch.isfinite(out).all()
    # every query attends to key 0 only
    torch.testing.assert_close(out, v[:, :, :1].expand_as(out), **F64_TOL)


def test_term_kinds_are_registered_once():
    from mmpe.models.layers.terms.registry import TERM_KINDS, register_term
    from mmpe.models.layers.terms.relative_term import RelativeTerm
    assert 'irpe' in TERM_KINDS

    class Other(RelativeTerm):
        kind = 'irpe'

    with pytest.raises(ValueError, match="kind 'irpe' is registered twice"):
        register_term(Other)



def test_chunked_dropout_matches_a_reference_with_its_masks():
    """Attention dropout in the chunked backend: the forward's masks (drawn
    per chunk from a generator seeded once per call) are drawn again by the
    backward. Reference: softmax, the same masks reproduced here from the
    same seed and draw order, ``* mask / (1 - p)``, ``@ v`` and iRPE on
    values of the dropped probabilities, differentiated by autograd."""
    cfg = dict(mode='contextual', method='cross', ratio=1.0,
               shared_head=False, init='xavier')
    p, rows, skip = 0.3, 4, 1
    core = PEAttention(8, 2, rpe_cfg=cfg, rpe_on='qkv', skip=skip,
                       attn_drop=p, attn_impl='chunked',
                       chunk_size=rows).double().train()
    explicit = PEAttention(8, 2, rpe_cfg=cfg, rpe_on='qkv', skip=skip,
                           attn_impl='explicit').double()
    explicit.load_state_dict(core.state_dict())
    q, k, v, mask = _inputs(skip)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    torch.manual_seed(11)
    out = core.attend(*leaves, GRID, mask)

    # the masks: one seed from the global generator, then per chunk
    torch.manual_seed(11)
    gen = torch.Generator().manual_seed(int(torch.randint(2**62, (1, ))))
    n = q.shape[2]
    keep = torch.cat([
        torch.empty(2, 2, min(rows, n - s), n,
                    dtype=torch.float64).bernoulli_(1 - p, generator=gen)
        for s in range(0, n, rows)
    ], dim=2)
    assert 0 < float(keep.mean()) < 1
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    qr, kr, vr = ref_leaves
    scale = 1 / math.sqrt(4)
    logits = (qr * scale) @ kr.transpose(-1, -2)
    for term in explicit.relative_terms(qr * scale, kr * scale, *GRID)[:2]:
        logits = logits + term.dense()[0]
    logits = logits.masked_fill(mask[:, None, None], float('-inf'))
    dropped = logits.softmax(-1) * keep / (1 - p)
    ref = dropped @ vr + explicit.rpe_v(dropped, *GRID)
    # the reference's tables are explicit's
    _assert_fwd_bwd(out, ref, leaves, ref_leaves,
                    [getattr(core, f'rpe_{c}').table for c in 'qkv'],
                    [getattr(explicit, f'rpe_{c}').table for c in 'qkv'])


class _DecomposedRelPos(RelativeTerm):
    """ViTDet's decomposed relative position (Li et al. 2022) written as a
    relative term, to show that one plugs in without backend changes:
    ``e_ij += rel_h[i, jy] + rel_w[i, jx]`` with the per-query lookups
    ``rel_h = q . R_h[iy - jy]`` (B, H, L, h) and ``rel_w`` (B, H, L, w)
    (of the scaled queries here)."""

    kind = 'test-decomposed-rel-pos'

    def _rows(self, t, rows):
        return t if rows is None else t[:, :, rows[0]:rows[1]]

    def add_rows(self, logits, rows):
        b, h, r, _ = logits.shape
        view = logits.view(b, h, r, self.height, self.width)
        rel_h, rel_w = (self._rows(t, rows) for t in self.tensors)
        view.add_(rel_h[..., :, None]).add_(rel_w[..., None, :])
        return logits

    def dense(self):
        rel_h, rel_w = self.tensors
        b, h, n, _ = rel_h.shape
        return (rel_h[..., :, None] + rel_w[..., None, :]).view(b, h, n,
                                                                n), True

    def backward_rows(self, grad, rows, grads, probs=None, grad_out=None):
        b, h, r, _ = grad.shape
        g = grad.view(b, h, r, self.height, self.width)
        grads[0][:, :, rows[0]:rows[1]] += g.sum(-1)
        grads[1][:, :, rows[0]:rows[1]] += g.sum(-2)


class _WithDecomposed(PEAttention):
    """PEAttention plus the term above from per-axis tables R_h, R_w."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        g = torch.Generator().manual_seed(3)
        self.rel_h = torch.nn.Parameter(torch.randn(2 * GRID[0] - 1, 4,
                                                    generator=g))
        self.rel_w = torch.nn.Parameter(torch.randn(2 * GRID[1] - 1, 4,
                                                    generator=g))

    def relative_terms(self, qs, ks, height, width):
        terms = super().relative_terms(qs, ks, height, width)
        ys, xs = torch.arange(height), torch.arange(width)
        r_h = self.rel_h[ys[:, None] - ys[None] + height - 1]  # (h, h, d)
        r_w = self.rel_w[xs[:, None] - xs[None] + width - 1]  # (w, w, d)
        qg = qs.unflatten(2, (height, width))  # (B, H, h, w, d), scaled
        rel_h = torch.einsum('bnyxd,ykd->bnyxk', qg, r_h).flatten(2, 3)
        rel_w = torch.einsum('bnyxd,xkd->bnyxk', qg, r_w).flatten(2, 3)
        return terms + [_DecomposedRelPos({}, [rel_h, rel_w], height, width,
                                          height * width, '{}')]


@pytest.fixture
def decomposed_kind():
    from mmpe.models.layers.terms.registry import TERM_KINDS
    register_term(_DecomposedRelPos)
    yield
    TERM_KINDS.pop(_DecomposedRelPos.kind)


@pytest.mark.parametrize('impl', ['explicit', 'chunked', 'sdpa'])
def test_a_new_relative_term_runs_on_every_backend(decomposed_kind, impl):
    """A term written only against the RelativeTerm interface (with iRPE on
    keys beside it) equals the dense formula written here, forward and
    backward (inputs and the term's tables), on each backend."""
    cfg = dict(mode='contextual', method='product', ratio=1.0, init='xavier')
    torch.manual_seed(0)
    core = _WithDecomposed(8, 2, rpe_cfg=cfg, rpe_on='k', attn_impl=impl,
                           chunk_size=4).double()
    q, k, v, mask = _inputs(0)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = core.attend(*leaves, GRID, mask)
    grad = torch.randn(out.shape, dtype=out.dtype)
    out.backward(grad)
    got = [t.grad for t in leaves] + [core.rel_h.grad, core.rel_w.grad]

    # the dense formula: logits + iRPE (explicit, tested elsewhere) + the
    # decomposed term pair by pair
    refs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    tables = [core.rel_h.detach().clone().requires_grad_(True),
              core.rel_w.detach().clone().requires_grad_(True)]
    qr, kr, vr = refs
    scale = 0.5
    logits = (qr * scale) @ kr.transpose(-1, -2)
    logits = logits + core.rpe_k(qr * scale, *GRID)
    n, (hh, ww) = q.shape[2], GRID
    extra = torch.stack([
        torch.stack([
            (qr[:, :, i] * scale) @ (tables[0][i // ww - j // ww + hh - 1] +
                                     tables[1][i % ww - j % ww + ww - 1])
            for j in range(n)
        ], -1) for i in range(n)
    ], 2)  # (B, H, L, L)
    logits = (logits + extra).masked_fill(mask[:, None, None],
                                          float('-inf'))
    ref = logits.softmax(-1) @ vr
    torch.testing.assert_close(out, ref, **F64_TOL)
    ref.backward(grad)
    want = [t.grad for t in refs] + [t.grad for t in tables]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **F64_TOL)
