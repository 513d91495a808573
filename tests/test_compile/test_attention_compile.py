"""The attention core compiles in one graph with a symbolic grid, forward
and backward, for every iRPE setting, RoPE and the offset biases (log-CPB,
2D ALiBi, LookHere), and the compiled module equals eager forward and
backward.

Backend ``aot_eager``: TorchDynamo traces the forward, AOTAutograd traces the
joint forward/backward graph (functionalisation included), and the graph
runs eagerly; inductor's code generation is exercised on the representative
encoders of ``test_encoder_compile.py``. One compiled function sees three
grid sizes (a padded image in each batch) and must compile exactly once:
``fullgraph=True`` makes a graph break an error.
"""
import pytest
import torch

from mmpe.models.layers import ViTAttention, PEMultiheadAttention

#: aot_eager runs the same ATen kernels as eager; only the gradient
#: accumulation order of the traced backward may differ (float32)
FWD_TOL = dict(atol=1e-5, rtol=1e-5)
GRIDS = ((3, 4), (5, 2), (4, 6))

# Every (mode, method) with rpe_on k, q, v and all three (bias: k, qk);
# index, table sharing, skip tokens and the layout rotate across them.
CASES = []
for i, (mode, method, rpe_on) in enumerate(
        [(m, meth, on) for m, ons in (('contextual', ('k', 'q', 'v', 'qkv')),
                                      ('bias', ('k', 'qk')))
         for meth in ('product', 'cross', 'euclidean', 'quant')
         for on in ons]):
    CASES.append(
        dict(
            rpe_cfg=dict(
                mode=mode, method=method, shared_head=bool(i % 2),
                init='xavier',
                **(dict(index='clip', max_distance=2) if i % 3 == 2 else dict(
                    ratio=1.0))),
            rpe_on=rpe_on,
            skip=i % 2,
            layout='timm' if i % 4 == 1 else 'mmcv'))
# the chunked backend (the custom op mmpe::attention, chunks of 5 query
# rows: never a multiple of the grids' lengths below)
CHUNKED = [
    dict(CASES[i], impl='chunked')
    for i in range(len(CASES))
    if CASES[i]['rpe_cfg']['method'] in ('product', 'euclidean') or i % 5 == 0
]
CASES += CHUNKED
# the fused CPU kernel (the custom op mmpe::fused_attention): every setting
# it reads ('auto' takes it for those too, in training)
CASES += [
    dict(case, impl='fused') for case in CASES if 'impl' not in case and
    case['rpe_on'] == 'k' and not case['skip'] and
    case['rpe_cfg']['method'] in ('product', 'cross')
]
# the offset biases (Swin-V2's log-CPB, 2D ALiBi, LookHere): 4 heads,
# 'auto' (the fused CPU kernel), chunked and explicit, with a class token
BIASES = [dict(type='log-cpb', pretrained_size=(4, 4), hidden=8),
          dict(type='alibi-2d'), dict(type='lookhere', directions='corners')]
CASES += [
    dict(bias_cfg=bias, impl=impl, skip=skip, layout=layout, heads=4)
    for bias in BIASES for impl, skip, layout in (('auto', 0, 'mmcv'),
                                                  ('chunked', 1, 'timm'),
                                                  ('explicit', 0, 'timm'))
]
CASES += [
    dict(rope_cfg=dict(type='rope2d'), layout='mmcv'),
    dict(rope_cfg=dict(type='rope-mixed'), layout='mmcv'),
    dict(rope_cfg=dict(type='rope-mixed'), layout='mmcv', both=True),
    dict(layout='mmcv'),
]


def _case_id(case):
    if 'bias_cfg' in case:
        return (f"{case['bias_cfg']['type']}-skip{case['skip']}-"
                f"{case['layout']}-{case['impl']}")
    if 'rpe_cfg' not in case:
        return case.get('rope_cfg', {}).get('type', 'none') + (
            '+irpe' if case.get('both') else '')
    cfg = case['rpe_cfg']
    return (f"{cfg['mode']}-{cfg['method']}-{case['rpe_on']}-"
            f"skip{case['skip']}-{case['layout']}-{case.get('impl', 'auto')}")


def _module(case):
    torch.manual_seed(0)
    impl = dict(attn_impl=case.get('impl', 'auto'), chunk_size=5)
    if 'bias_cfg' in case:
        if case['layout'] == 'timm':
            return ViTAttention(16, case['heads'], bias_cfg=case['bias_cfg'],
                                skip=case['skip'], **impl)
        return PEMultiheadAttention(16, case['heads'], batch_first=True,
                                    bias_cfg=case['bias_cfg'], **impl)
    if case['layout'] == 'timm':
        return ViTAttention(
            16, 2, rpe_cfg=case['rpe_cfg'], rpe_on=case['rpe_on'],
            skip=case['skip'], **impl)
    rpe = case.get('rpe_cfg')
    if case.get('both'):  # RoPE and iRPE in one attention
        rpe = dict(mode='contextual', method='product', ratio=1.0)
    kwargs = dict(rpe_cfg=rpe, rope_cfg=case.get('rope_cfg'))
    if rpe is not None:
        kwargs['rpe_on'] = case.get('rpe_on', 'k')
        kwargs['rpe_cfg'] = dict(rpe, skip=case.get('skip', 0))
    return PEMultiheadAttention(16, 2, batch_first=True, **kwargs, **impl)


class GridCall(torch.nn.Module):
    """Attention over the tokens of a feature map ``(B, C, h, w)`` (plus
    ``skip`` leading tokens), the grid read from the map's shape."""

    def __init__(self, attn, skip):
        super().__init__()
        self.attn, self.skip = attn, skip

    def forward(self, feat, mask):
        height, width = feat.shape[-2:]
        x = feat.flatten(2).transpose(1, 2)  # (B, h * w, C)
        if self.skip:
            x = torch.cat([x.mean(1, keepdim=True), x], dim=1)
            mask = torch.cat([mask[:, :1] & False, mask], dim=1)
        if isinstance(self.attn, ViTAttention):
            return self.attn(x, (height, width), key_padding_mask=mask)
        return self.attn(
            x, key_padding_mask=mask, spatial_shape=(height, width))


def _inputs(grid, seed):
    g = torch.Generator().manual_seed(seed)
    feat = torch.randn(2, 16, *grid, generator=g)
    mask = torch.zeros(2, grid[0] * grid[1], dtype=torch.bool)
    mask[1, -grid[1]:] = True  # the second image's last row is padding
    return feat, mask


def _fwd_bwd(fn, module, feat, mask):
    feat = feat.clone().requires_grad_(True)
    out = fn(feat, mask)
    g = torch.Generator().manual_seed(7)
    (out * torch.randn(out.shape, generator=g)).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    module.zero_grad(set_to_none=True)
    return out.detach(), feat.grad, grads


def _fresh_compile(call):
    """``call`` compiled (aot_eager, fullgraph, dynamic) with dynamo's
    caches and counters reset."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    return torch.compile(
        call, backend='aot_eager', fullgraph=True, dynamic=True)


def _assert_equal(got, want):
    """Output, input gradient and every weight's gradient."""
    torch.testing.assert_close(got[0], want[0], **FWD_TOL)
    torch.testing.assert_close(got[1], want[1], **FWD_TOL)
    for name in want[2]:
        torch.testing.assert_close(
            got[2][name], want[2][name], **FWD_TOL, msg=name)


@pytest.mark.parametrize('case', CASES, ids=_case_id)
def test_attention_compiles_once_and_equals_eager(case):
    call = GridCall(_module(case), case.get('skip', 0)).train()
    compiled = _fresh_compile(call)
    for i, grid in enumerate(GRIDS):
        feat, mask = _inputs(grid, i)
        got = _fwd_bwd(compiled, call, feat, mask)
        _assert_equal(got, _fwd_bwd(call, call, feat, mask))
    stats = torch._dynamo.utils.counters['stats']
    assert stats['unique_graphs'] == 1
    assert not torch._dynamo.utils.counters['graph_break']


@pytest.mark.parametrize(
    'case', [c for i, c in enumerate(CASES) if i % 3 == 0 or 'bias_cfg' in c],
    ids=_case_id)
def test_inference_path_compiles_once(case):
    """Without gradients the core takes its other path (the terms as a
    constant SDPA mask); it too stays one graph over the grids."""
    call = GridCall(_module(case), case.get('skip', 0)).eval()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(
        call, backend='eager', fullgraph=True, dynamic=True)
    with torch.no_grad():
        for i, grid in enumerate(GRIDS):
            feat, mask = _inputs(grid, i)
            torch.testing.assert_close(
                compiled(feat, mask), call(feat, mask), **FWD_TOL)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1


@pytest.mark.parametrize('impl,op', [('auto', 'mmpe.fused_attention'),
                                     ('fused', 'mmpe.fused_attention'),
                                     ('explicit', 'mmpe.attention'),
                                     ('chunked', 'mmpe.attention')])
def test_training_graph_calls_the_attention_op(impl, op):
    """A compiled training step runs the attention core as one opaque custom
    op: on CPU the default backend is the fused kernel for this term
    (mmpe::fused_attention), 'explicit' and 'chunked' the eager in-place
    kernels of mmpe::attention (explicit: probabilities saved). Without
    gradients 'explicit' is SDPA (no custom op); 'auto', 'fused' and
    'chunked' keep their bounded-memory forward there, but never under
    torch.export."""
    case = dict(CASES[0], impl=impl)
    call = GridCall(_module(case), 0)
    graphs = []

    def record(gm, inputs):
        graphs.append(gm)
        return gm.forward

    feat, mask = _inputs(GRIDS[0], 0)
    torch._dynamo.reset()
    compiled = torch.compile(call, backend=record, fullgraph=True,
                             dynamic=True)
    compiled(feat.requires_grad_(True), mask)
    with torch.no_grad():
        compiled(feat, mask)
    ops = [{str(n.target) for n in gm.graph.nodes} for gm in graphs]
    assert len(ops) == 2
    custom = [{t for t in o if t.startswith('mmpe.')} for o in ops]
    assert custom[0] == {op}, ops[0]
    assert custom[1] == ({op} if impl != 'explicit' else set())
    with torch.no_grad():
        exported = torch.export.export(call, (feat, mask))
    targets = {str(n.target) for n in exported.graph.nodes}
    assert not any(t.startswith('mmpe.') for t in targets)


@pytest.mark.parametrize('impl', ['auto', 'chunked'])
def test_dropout_training_compiles_once(impl):
    """Attention dropout in the compiled training op: one graph, no break.
    'chunked' draws its masks from a seed taken from the global generator,
    so (aot_eager runs that draw eagerly) it equals eager for the same
    torch.manual_seed; the default backend at these lengths is explicit,
    whose eager dropout (F.dropout) draws other masks than the op."""
    torch.manual_seed(0)
    attn = PEMultiheadAttention(
        16, 2, batch_first=True, attn_drop=0.3, attn_impl=impl, chunk_size=5,
        rpe_on='qkv', rpe_cfg=dict(mode='contextual', method='product',
                                   ratio=1.0, init='xavier'))
    call = GridCall(attn, 0).train()
    compiled = _fresh_compile(call)
    for i, grid in enumerate(GRIDS):
        feat, mask = _inputs(grid, i)
        torch.manual_seed(100 + i)
        got = _fwd_bwd(compiled, call, feat, mask)
        assert all(torch.isfinite(g).all() for g in got[2].values())
        if impl != 'chunked':
            continue
        torch.manual_seed(100 + i)
        _assert_equal(got, _fwd_bwd(call, call, feat, mask))
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
    assert not torch._dynamo.utils.counters['graph_break']
