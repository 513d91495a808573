"""The attention core: every backend against the explicit one (itself checked
against per-pair loops in test_irpe_attention.py), forward and backward,
in both parameter layouts (mmcv's for DETR, timm's for the ViT)."""
import math
import warnings

import pytest
import torch

from mmpe.models.layers import (PEAttention, RoPE2D, ViTAttention,
                                PEMultiheadAttention)

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
    m = PEMultiheadAttention(
        16, 2, batch_first=True, rpe_on=rpe_on, attn_impl=impl,
        rpe_cfg=dict(ratio=1.0, skip=skip, init='xavier', **rpe)).double()
    return m


def _timm_layout(impl, rpe, rpe_on, skip):
    torch.manual_seed(0)
    return ViTAttention(
        16, 2, rpe_on=rpe_on, attn_impl=impl, skip=skip,
        rpe_cfg=dict(ratio=1.0, init='xavier', **rpe)).double()


def _run(module, x, mask, hw):
    if isinstance(module, PEMultiheadAttention):
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


def _piecewise(x, alpha, beta, gamma):
    """iRPE Eq. 18, scalar: ``round(x)`` for ``|x| <= alpha``, else the
    sign of x times ``min(beta, round(alpha + ln(|x| / alpha) /
    ln(gamma / alpha) (beta - alpha)))``."""
    if abs(x) <= alpha:
        return round(x)
    y = alpha + math.log(abs(x) / alpha) / math.log(gamma / alpha) * (
        beta - alpha)
    return int(math.copysign(min(beta, round(y)), x))


def _product_bucket_ids(hw, skip, ratio):
    """The product method's bucket of each (query, key) pair: Eq. 18 on
    the row and the column offset (query minus key), with the authors'
    ``alpha, beta, gamma = ratio, 2 ratio, 8 ratio``; bucket ``(r + b)
    (2 b + 1) + c + b`` with ``b = beta``; pairs with a skip token use
    the extra bucket after these ``(2 b + 1)^2``."""
    alpha, beta, gamma = ratio, 2 * ratio, 8 * ratio
    b = int(beta)
    n = skip + hw[0] * hw[1]
    ids = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i < skip or j < skip:
                ids[i][j] = (2 * b + 1)**2
                continue
            dy = (i - skip) // hw[1] - (j - skip) // hw[1]
            dx = (i - skip) % hw[1] - (j - skip) % hw[1]
            ids[i][j] = ((_piecewise(dy, alpha, beta, gamma) + b) *
                         (2 * b + 1) + _piecewise(dx, alpha, beta, gamma) + b)
    return ids


def _rotate_axial(t, row, col, theta=100.):
    """RoPE-Axial (Heo et al., Eq. 10-11; RoFormer Eq. 34) of one head
    vector ``t`` (D,): pair ``(j, j + Q)`` (``Q = D / 4``) turns by
    ``col theta^(-j / Q)``, pair ``(2 Q + j, 3 Q + j)`` by
    ``row theta^(-j / Q)``."""
    q = t.shape[0] // 4
    out = t.clone()
    for j in range(q):
        freq = theta**(-j / q)
        for first, angle in ((j, col * freq), (2 * q + j, row * freq)):
            u, v = t[first], t[first + q]
            c, s = math.cos(angle), math.sin(angle)
            out[first], out[first + q] = u * c - v * s, v * c + u * s
    return out


def test_vit_attention_equals_a_direct_loop_with_rope_and_irpe():
    """timm layout + axial RoPE + contextual iRPE on k with a class token,
    against softmax_j(rot(q_i) . rot(k_j) / sqrt(d) + q_i / sqrt(d) .
    r_b(i, j)) written per pair, with the rotations and the bucket ids
    b(i, j) computed here from their equations."""
    torch.manual_seed(3)
    hw, skip, d = (2, 3), 1, 8
    m = ViTAttention(16, 2, skip=skip, rpe_on='k', rpe_cfg=dict(
        mode='contextual', method='product', ratio=1.0,
        init='xavier')).double()
    n = skip + hw[0] * hw[1]
    x = torch.randn(1, n, 16, dtype=torch.float64, requires_grad=True)
    rope = RoPE2D(d)(hw, torch.device('cpu'), torch.float64)
    got = m(x, hw, rope=rope)

    x_ref = x.detach().clone().requires_grad_()
    q, k, v = m.qkv(x_ref).reshape(1, n, 3, 2, d).permute(2, 0, 3, 1,
                                                          4)[:, 0]

    def rot(t, i):  # the class token is not rotated
        if i < skip:
            return t
        return _rotate_axial(t, *divmod(i - skip, hw[1]))

    ids = _product_bucket_ids(hw, skip, 1.0)
    table = m.rpe_k.table[0]  # shared head: (buckets, d)
    assert table.shape[0] == 5 * 5 + 1  # beta 2: 5 ids per axis, + skip
    rows = []
    for h in range(2):
        for i in range(n):
            logits = torch.stack([
                rot(q[h, i], i) @ rot(k[h, j], j) / d**0.5 +
                q[h, i] / d**0.5 @ table[ids[i][j]] for j in range(n)
            ])
            rows.append(logits.softmax(0) @ v[h])
    out = torch.stack(rows).view(2, n, d)
    want = m.proj(out.transpose(0, 1).reshape(1, n, 16))
    torch.testing.assert_close(got, want, **F64_TOL)
    # backward: the input, the projections and the iRPE table
    grad_out = torch.randn_like(got)
    params = list(m.parameters())
    got_grads = torch.autograd.grad((got * grad_out).sum(), [x] + params)
    want_grads = torch.autograd.grad((want * grad_out).sum(),
                                     [x_ref] + params)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, **F64_TOL)


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
