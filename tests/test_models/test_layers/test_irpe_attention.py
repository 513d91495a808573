"""PEMultiheadAttention against mmcv's attention and a loop reference."""
import math

import pytest
import torch
from mmcv.cnn.bricks.transformer import MultiheadAttention

from mmpe.models.layers import PEMultiheadAttention

# float64 everywhere below: the loop reference and the module then agree to
# rounding, so the tolerance can stay tight.
ATOL = 1e-9


def _randomise_tables(module, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if name.endswith('table'):
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))


def _pair_vector(rpe, ids, i, j, head):
    """Table row(s) for the pair (i, j): cross sums its two axes."""
    h = 0 if rpe.table.shape[0] == 1 else head
    if ids.dim() == 3:  # cross: (2, L, L)
        return rpe.table[h, ids[0, i, j]] + rpe.table[h, ids[1, i, j]]
    return rpe.table[h, ids[i, j]]


def reference_attention(m, x, pos, key_padding_mask, hw):
    """Eq. 13-17 of the iRPE paper, one (batch, head, i, j) at a time."""
    height, width = hw
    bs, n, dims = x.shape
    d = m.head_dims
    w_q, w_k, w_v = m.attn.in_proj_weight.chunk(3)
    b_q, b_k, b_v = m.attn.in_proj_bias.chunk(3)
    xq = x + pos
    q = xq @ w_q.T + b_q
    k = xq @ w_k.T + b_k
    v = x @ w_v.T + b_v
    scale = 1 / math.sqrt(d)
    ids = {
        letter: getattr(m, f'rpe_{letter}').bucket_ids(height, width)
        for letter in 'qkv' if getattr(m, f'rpe_{letter}') is not None
    }
    out = torch.zeros(bs, n, dims, dtype=x.dtype)
    for b in range(bs):
        for head in range(m.num_heads):
            sl = slice(head * d, (head + 1) * d)
            for i in range(n):
                logits = []
                for j in range(n):
                    qi, kj = q[b, i, sl] * scale, k[b, j, sl]
                    e = qi @ kj
                    if 'k' in ids:
                        r = _pair_vector(m.rpe_k, ids['k'], i, j, head)
                        e = e + (qi @ r if r.dim() else r)
                    if 'q' in ids:
                        # r^Q seen from the key: bucket of (key j, query i)
                        r = _pair_vector(m.rpe_q, ids['q'], j, i, head)
                        e = e + ((kj * scale) @ r if r.dim() else r)
                    if key_padding_mask is not None \
                            and key_padding_mask[b, j]:
                        e = e * 0 + float('-inf')
                    logits.append(e)
                a = torch.stack(logits).softmax(0)
                z = sum(a[j] * v[b, j, sl] for j in range(n))
                if 'v' in ids:
                    z = z + sum(a[j] * _pair_vector(m.rpe_v, ids['v'], i, j,
                                                    head) for j in range(n))
                out[b, i, sl] = z
    return x + m.attn.out_proj(out)


CASES = [
    dict(mode='contextual', method='product', rpe_on='k'),
    dict(mode='contextual', method='cross', rpe_on='qkv'),
    dict(mode='contextual', method='euclidean', rpe_on='qv', shared=False),
    dict(mode='contextual', method='quant', rpe_on='kv', skip=1),
    dict(mode='bias', method='product', rpe_on='qk', shared=False),
    dict(mode='bias', method='cross', rpe_on='k', skip=2),
]


@pytest.mark.parametrize('case', CASES, ids=lambda c: '-'.join(
    f'{v}' for v in c.values()))
def test_matches_loop_reference_forward_backward(case):
    torch.manual_seed(0)
    hw, skip = (2, 3), case.get('skip', 0)
    n = skip + hw[0] * hw[1]
    m = PEMultiheadAttention(
        embed_dims=8,
        num_heads=2,
        batch_first=True,
        rpe_cfg=dict(
            mode=case['mode'],
            method=case['method'],
            ratio=1.0,
            shared_head=case.get('shared', True),
            skip=skip),
        rpe_on=case['rpe_on']).double().eval()
    _randomise_tables(m)
    x = torch.randn(2, n, 8, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(2, n, 8, dtype=torch.float64)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, -2:] = True  # padded keys of the second image

    out = m(x, query_pos=pos, key_padding_mask=mask, spatial_shape=hw)
    ref = reference_attention(m, x, pos, mask, hw)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)

    grad = torch.randn_like(out)
    params = [x] + [p for p in m.parameters()]
    got = torch.autograd.grad(out, params, grad, allow_unused=True)
    want = torch.autograd.grad(ref, params, grad, allow_unused=True)
    for g, w in zip(got, want):
        if w is None:
            continue
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)


@pytest.mark.parametrize('batch_first', [True, False])
@pytest.mark.parametrize('rpe_on', ['k', 'qkv'])
def test_zero_tables_equal_mmcv_attention(batch_first, rpe_on):
    torch.manual_seed(0)
    ref = MultiheadAttention(
        embed_dims=16, num_heads=4, batch_first=batch_first).eval()
    m = PEMultiheadAttention(
        embed_dims=16,
        num_heads=4,
        batch_first=batch_first,
        rpe_cfg=dict(mode='contextual', method='product'),
        rpe_on=rpe_on).eval()
    result = m.load_state_dict(ref.state_dict(), strict=False)
    assert not result.unexpected_keys
    assert sorted(result.missing_keys) == sorted(
        f'rpe_{letter}.table' for letter in rpe_on)
    hw = (3, 5)
    x = torch.randn(2, 15, 16)
    pos = torch.randn(2, 15, 16)
    mask = torch.zeros(2, 15, dtype=torch.bool)
    mask[0, 10:] = True
    if not batch_first:
        x, pos = x.transpose(0, 1), pos.transpose(0, 1)
    want = ref(x, query_pos=pos, key_padding_mask=mask)
    got = m(x, query_pos=pos, key_padding_mask=mask, spatial_shape=hw)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_padded_keys_stay_masked():
    torch.manual_seed(0)
    m = PEMultiheadAttention(
        16, 4, batch_first=True, rpe_cfg=dict(), rpe_on='qkv').eval()
    _randomise_tables(m)
    x = torch.randn(1, 12, 16)
    mask = torch.zeros(1, 12, dtype=torch.bool)
    mask[0, 8:] = True
    out = m(x, key_padding_mask=mask, spatial_shape=(3, 4))
    x2 = x.clone()
    x2[0, 8:] = 100 * torch.randn(4, 16)  # change only padded tokens
    out2 = m(x2, key_padding_mask=mask, spatial_shape=(3, 4))
    torch.testing.assert_close(out[0, :8], out2[0, :8])


def test_no_rpe_is_plain_attention():
    m = PEMultiheadAttention(16, 4, batch_first=True, rpe_cfg=None)
    assert m.rpe_q is None and m.rpe_k is None and m.rpe_v is None
    x = torch.randn(2, 6, 16)
    assert m(x).shape == x.shape  # no grid needed


@pytest.mark.parametrize('kwargs, field', [
    (dict(embed_dims=16, num_heads=3), 'num_heads'),
    (dict(embed_dims=0, num_heads=1), 'embed_dims'),
    (dict(embed_dims=16, num_heads=4, rpe_cfg={}, rpe_on='kk'), 'rpe_on'),
    (dict(embed_dims=16, num_heads=4, rpe_cfg={}, rpe_on='x'), 'rpe_on'),
    (dict(embed_dims=16, num_heads=4, rpe_cfg=dict(mode='bias'),
          rpe_on='v'), 'v'),
    (dict(embed_dims=16, num_heads=4, rpe_cfg=dict(method='manhattan')),
     'manhattan'),
])
def test_bad_arguments_raise(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PEMultiheadAttention(**kwargs)


def test_grid_errors_name_the_numbers():
    m = PEMultiheadAttention(16, 4, batch_first=True, rpe_cfg={})
    x = torch.randn(1, 12, 16)
    with pytest.raises(ValueError, match='spatial_shape'):
        m(x)
    with pytest.raises(ValueError, match=r'\(3, 5\).*15.*12'):
        m(x, spatial_shape=(3, 5))
