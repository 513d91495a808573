"""The attention core: every backend against the explicit one (itself checked
against per-pair loops in test_irpe_attention.py), forward and backward,
in both parameter layouts (mmcv's for DETR, timm's for the ViT)."""
import warnings

import pytest
import torch

from mmpe.models.layers import (PEAttention, RoPE2D, ViTAttention,
                                iRPEMultiheadAttention)

# float64 throughout: the backends sum the same terms in another order
F64_TOL = dict(atol=1e-10, rtol=1e-9)

RPES = [
    dict(mode='contextual', method='product'),
    dict(mode='bias', method='product', shared_head=False),
    dict(mode='contextual', method='cross', shared_head=False),
    dict(mode='bias', method='euclidean'),
    dict(mode='contextual', method='quant', index='clip', max_distance=2),
]


def _mmcv_layout(impl, rpe, rpe_on, skip):
    torch.manual_seed(0)
    m = iRPEMultiheadAttention(
        16, 2, batch_first=True, rpe_on=rpe_on, attn_impl=impl,
        rpe_cfg=dict(ratio=1.0, skip=skip, init='xavier', **rpe)).double()
    return m


def _timm_layout(impl, rpe, rpe_on, skip):
    torch.manual_seed(0)
    return ViTAttention(
        16, 2, rpe_on=rpe_on, attn_impl=impl, skip=skip,
        rpe_cfg=dict(ratio=1.0, init='xavier', **rpe)).double()


def _run(module, x, mask, hw):
    if isinstance(module, iRPEMultiheadAttention):
        return module(x, key_padding_mask=mask, spatial_shape=hw)
    return module(x, hw, key_padding_mask=mask)


def _fwd_bwd(module, hw=(3, 4), skip=0):
    torch.manual_seed(1)
    n = skip + hw[0] * hw[1]
    x = torch.randn(2, n, 16, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, -3:] = True  # the second image is padded
    out = _run(module, x, mask, hw)
    grad_out = torch.randn_like(out)
    (out * grad_out).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    return out.detach(), x.grad.clone(), grads


@pytest.mark.parametrize('layout', [_mmcv_layout, _timm_layout])
@pytest.mark.parametrize('rpe', RPES)
@pytest.mark.parametrize('rpe_on', ['k', 'qk'])
@pytest.mark.parametrize('skip', [0, 1])
def test_sdpa_equals_explicit_forward_backward(layout, rpe, rpe_on, skip):
    want = _fwd_bwd(layout('explicit', rpe, rpe_on, skip), skip=skip)
    got = _fwd_bwd(layout('sdpa', rpe, rpe_on, skip), skip=skip)
    torch.testing.assert_close(got[0], want[0], **F64_TOL)
    torch.testing.assert_close(got[1], want[1], **F64_TOL)
    assert got[2].keys() == want[2].keys()
    assert any(name.endswith('table') for name in got[2])
    for name in want[2]:  # every weight, the iRPE tables included
        torch.testing.assert_close(got[2][name], want[2][name], **F64_TOL)


def test_flex_backward_on_cpu_falls_back_to_explicit_once_per_module():
    """PyTorch has no FlexAttention backward on CPU: 'flex' runs the
    explicit backend there, with gradients equal to it, warning once."""
    rpe = dict(mode='contextual', method='product')
    want = _fwd_bwd(_mmcv_layout('explicit', rpe, 'qk', 0))
    flex = _mmcv_layout('flex', rpe, 'qk', 0)
    with pytest.warns(UserWarning, match='falls back'):
        got = _fwd_bwd(flex)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # a second call does not warn again
        _fwd_bwd(flex)
    torch.testing.assert_close(got[1], want[1], **F64_TOL)
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], **F64_TOL)


def test_vit_attention_equals_a_direct_loop_with_rope_and_irpe():
    """timm layout + axial RoPE + contextual iRPE on k with a class token,
    against softmax_j(rot(q_i) . rot(k_j) / sqrt(d) + q_i / sqrt(d) .
    r_b(i, j)) written per pair."""
    torch.manual_seed(3)
    hw, skip, d = (2, 3), 1, 8
    m = ViTAttention(16, 2, skip=skip, rpe_on='k', rpe_cfg=dict(
        mode='contextual', method='product', ratio=1.0,
        init='xavier')).double()
    cos, sin = RoPE2D(d)(hw, torch.device('cpu'), torch.float64)
    n = skip + hw[0] * hw[1]
    x = torch.randn(1, n, 16, dtype=torch.float64)
    got = m(x, hw, rope=(cos, sin))

    q, k, v = m.qkv(x).reshape(1, n, 3, 2, d).permute(2, 0, 3, 1, 4)[:, 0]

    def rot(t, i):  # axial RoPE: quarters (a, b, c, d) -> (-b, a, -d, c)
        if i < skip:
            return t
        a, b, c, e = t.chunk(4)
        return t * cos[i - skip] + torch.cat([-b, a, -e, c]) * sin[i - skip]

    ids = m.rpe_k.bucket_ids(*hw)
    table = m.rpe_k.table[0]  # shared head: (buckets, d)
    out = torch.zeros(2, n, d, dtype=torch.float64)
    for h in range(2):
        for i in range(n):
            logits = torch.stack([
                rot(q[h, i], i) @ rot(k[h, j], j) / d**0.5 +
                q[h, i] / d**0.5 @ table[ids[i, j]] for j in range(n)
            ])
            out[h, i] = logits.softmax(0) @ v[h]
    want = m.proj(out.transpose(0, 1).reshape(1, n, 16))
    torch.testing.assert_close(got, want, **F64_TOL)


def test_bad_arguments_name_the_value_and_choices():
    with pytest.raises(ValueError, match=r"rpe_on.*'kv'.*'sdpa'"):
        PEAttention(16, 2, rpe_cfg={}, rpe_on='kv', attn_impl='sdpa')
    with pytest.raises(ValueError,
                       match=r"attn_impl.*'fast'.*'auto'.*'chunked'.*'fused'"):
        PEAttention(16, 2, attn_impl='fast')
    with pytest.raises(ValueError, match=r'chunk_size.*0.*int > 0'):
        PEAttention(16, 2, rpe_cfg={}, chunk_size=0)
    with pytest.raises(ValueError, match=r'rpe_cfg.skip.*2.*skip.*1'):
        PEAttention(16, 2, rpe_cfg=dict(skip=2), skip=1)
    with pytest.raises(ValueError, match=r'num_heads.*3'):
        PEAttention(16, 3)
