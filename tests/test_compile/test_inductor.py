"""Full ``torch.compile`` (inductor, C++ code generation on CPU) of
representative modules equals eager (the DETR-iRPE encoder forward and
backward, the DeiT-iRPE + PEG backbone forward) and compiles once over two
grid sizes. Code generation is slow on CPU, so only these
run it; every other choice is traced in ``test_graph_breaks.py`` and
``test_attention_compile.py``.
"""
import torch

from compile_cases import GRIDS, EncoderCall, feature_batch, small_detector
from mmpe.models.backbones import CPVT

# inductor fuses and reorders float32 reductions (softmax, matmul epilogues)
TOL = dict(atol=1e-4, rtol=1e-4)


def _grads(module):
    grads = {n: p.grad.clone() for n, p in module.named_parameters()
             if p.grad is not None}
    module.zero_grad(set_to_none=True)
    return grads


def test_detr_irpe_encoder_inductor_equals_eager():
    relative = dict(type='irpe', mode='contextual', method='product', on='k')
    detector = small_detector('DETR', dict(absolute='sine',
                                           relative=relative)).train()
    for m in detector.modules():  # dropout off: equal random streams
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    call = EncoderCall(detector)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(call, dynamic=True, fullgraph=True)
    for grid in GRIDS[:2]:
        feat, mask = feature_batch(grid, detector.embed_dims)
        results = []
        for fn in (compiled, call):
            x = feat.clone().requires_grad_(True)
            out = fn(x, mask)
            (out.square().mean()).backward()
            results.append((out.detach(), x.grad, _grads(detector)))
        (got, got_dx, got_dp), (want, want_dx, want_dp) = results
        torch.testing.assert_close(got, want, **TOL)
        torch.testing.assert_close(got_dx, want_dx, **TOL)
        assert got_dp.keys() == want_dp.keys()
        for name in want_dp:
            torch.testing.assert_close(got_dp[name], want_dp[name], **TOL,
                                       msg=name)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1


def test_deit_irpe_backbone_inductor_equals_eager():
    torch.manual_seed(0)
    backbone = CPVT(
        arch=dict(embed_dims=32, depth=1, num_heads=4, mlp_ratio=2.),
        img_size=64, patch_size=8, out_indices=(0, ),
        pos_encoding=('learnable', 'irpe', 'peg'),
        use_cls_token=True).eval()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(backbone, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for i, (h, w) in enumerate(GRIDS[:2]):
            g = torch.Generator().manual_seed(i)
            x = torch.randn(2, 3, 8 * h, 8 * w, generator=g)
            pad = torch.zeros(2, 8 * h, 8 * w, dtype=torch.bool)
            pad[1, :, -8:] = True
            torch.testing.assert_close(
                compiled(x, pad)[0], backbone(x, pad)[0], **TOL)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
