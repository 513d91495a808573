"""RoPE-Mixed (Heo et al., ECCV 2024, Sec. 3.3): rotation against a loop
reference of the paper's equation and against timm, relativity, gradients
to the frequencies, initialisation, errors."""
import math

import pytest
import torch

from mmpe.models.layers import PEAttention, RoPEMixed, apply_rope2d

_F64_ATOL = 1e-10  # float64, same products in another order
_F32_ATOL = 1e-5  # float32 angles up to ~50 rad: cos/sin rounding ~1e-6


def _loop_rotate(x, freqs, hw_shape):
    """Paper's RoPE-Mixed, one pair at a time: pair t of head h at column
    px, row py turns by theta^x_t px + theta^y_t py (complex product).
    Pairs in mmpe's quarter layout: t < D/4 is channels (t, t + D/4), the
    others (D/4 + t, D/2 + t)."""
    h, w = hw_shape
    _, heads, n, d = x.shape
    q = d // 4
    out = x.clone()
    for b in range(x.shape[0]):
        for head in range(heads):
            for tok in range(n):
                py, px = divmod(tok, w)
                for t in range(d // 2):
                    i, j = (t, t + q) if t < q else (q + t, 2 * q + t)
                    ang = float(freqs[0, head, t] * px + freqs[1, head, t] *
                                py)
                    z = complex(x[b, head, tok, i], x[b, head, tok, j]) * \
                        complex(math.cos(ang), math.sin(ang))
                    out[b, head, tok, i], out[b, head, tok, j] = z.real, z.imag
    return out


@pytest.mark.parametrize('hw_shape', [(3, 4), (1, 5), (4, 1)])
def test_rotation_matches_loop_reference(hw_shape):
    torch.manual_seed(0)
    rope = RoPEMixed(8, 3).double()
    x = torch.randn(2, 3, hw_shape[0] * hw_shape[1], 8, dtype=torch.float64)
    cos, sin = rope(hw_shape, dtype=torch.float64)
    assert cos.shape == sin.shape == (3, x.shape[2], 8)
    ours = apply_rope2d(x, cos, sin)
    ref = _loop_rotate(x, rope.freqs.detach(), hw_shape)
    torch.testing.assert_close(ours, ref, atol=_F64_ATOL, rtol=0)


def test_skip_tokens_untouched_and_float32():
    torch.manual_seed(0)
    rope = RoPEMixed(8, 2)
    x = torch.randn(1, 2, 1 + 6, 8)
    cos, sin = rope((2, 3), x.device, x.dtype)
    out = apply_rope2d(x, cos, sin, num_skip=1)
    assert torch.equal(out[:, :, :1], x[:, :, :1])
    ref = _loop_rotate(x[:, :, 1:].double(), rope.freqs.detach().double(),
                       (2, 3))
    torch.testing.assert_close(out[:, :, 1:].double(), ref, atol=_F32_ATOL,
                               rtol=0)


@pytest.mark.parametrize('hw_shape', [(4, 5), (6, 3)])
def test_relativity_score_depends_on_offset_only(hw_shape):
    """One query vector and one key vector on every token: the rotated
    score of (i, j) equals that of (i + s, j + s) for every shift s."""
    torch.manual_seed(0)
    heads, d = 2, 8
    rope = RoPEMixed(d, heads, theta=10.).double()
    h, w = hw_shape
    n = h * w
    q = torch.randn(1, heads, 1, d, dtype=torch.float64).expand(1, heads, n,
                                                               d)
    k = torch.randn(1, heads, 1, d, dtype=torch.float64).expand(1, heads, n,
                                                               d)
    cos, sin = rope(hw_shape, dtype=torch.float64)
    scores = apply_rope2d(q, cos, sin) @ apply_rope2d(k, cos, sin).mT
    ys, xs = torch.div(torch.arange(n), w, rounding_mode='floor'), \
        torch.arange(n) % w
    by_offset = {}
    for i in range(n):
        for j in range(n):
            off = (int(ys[i] - ys[j]), int(xs[i] - xs[j]))
            by_offset.setdefault(off, []).append(scores[0, :, i, j])
    checked = 0
    for values in by_offset.values():
        for value in values[1:]:
            torch.testing.assert_close(value, values[0], atol=_F64_ATOL,
                                       rtol=0)
            checked += 1
    assert checked > n  # many shifted pairs compared
    # and the score does change with the offset (frequencies mix x and y)
    assert not torch.allclose(scores[0, :, 0, 1], scores[0, :, 0, w])


def test_gradients_reach_frequencies():
    torch.manual_seed(0)
    rope = RoPEMixed(8, 2).double()
    attn = PEAttention(16, 2).double()
    q, k, v = (torch.randn(2, 2, 1 + 12, 8, dtype=torch.float64)
               for _ in range(3))
    attn.skip = 1  # a class token, unrotated
    out = attn.attend(q, k, v, (3, 4), rope=rope((3, 4),
                                                 dtype=torch.float64))
    out.square().sum().backward()
    assert rope.freqs.grad is not None
    assert rope.freqs.grad.abs().sum() > 0
    # the tables are a differentiable function of the frequencies
    torch.autograd.gradcheck(
        lambda f: _tables(f, (2, 3)), rope.freqs.detach().clone()
        .requires_grad_())
    # computed per call: a changed frequency changes the next tables
    cos0, _ = rope((2, 3), dtype=torch.float64)
    with torch.no_grad():
        rope.freqs.add_(0.1)
    assert not torch.allclose(rope((2, 3), dtype=torch.float64)[0], cos0)


def _tables(freqs, hw_shape):
    rope = RoPEMixed(8, 2).double()
    del rope.freqs
    rope.freqs = freqs  # a plain tensor, for gradcheck
    return rope(hw_shape, dtype=torch.float64)


def test_init_matches_paper_and_timm(timm):
    """Magnitudes theta^(-4j/D), one random direction per head, the second
    half of the pairs at +90 degrees -- as timm's init_random_2d_freqs."""
    from timm.layers.pos_embed_sincos import init_random_2d_freqs
    torch.manual_seed(3)
    ours = RoPEMixed(16, 4, theta=10.).freqs.detach()
    torch.manual_seed(3)
    theirs = init_random_2d_freqs(16, 1, 4, temperature=10.)[:, 0]
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    mags = ours.norm(dim=0)  # |(theta^x, theta^y)| per pair
    expected = 10.**(-torch.arange(4) * 4 / 16)
    torch.testing.assert_close(mags, expected.repeat(4, 2), atol=1e-6,
                               rtol=0)
    axis = RoPEMixed(16, 4, rotate=False).freqs.detach()
    assert torch.all(axis[1, :, :4] == 0) and torch.all(axis[0, :, 4:].abs()
                                                        < 1e-7)


def test_equals_timm_rotation_with_deinterleaved_channels(timm):
    """timm rotates interleaved pairs (2t, 2t + 1); the same frequencies in
    mmpe's quarter layout give the same vectors once the channels of each
    half are de-interleaved ([even | odd] per half)."""
    from timm.layers.pos_embed_sincos import (apply_rot_embed_cat,
                                              get_mixed_freqs,
                                              get_mixed_grid)
    torch.manual_seed(0)
    heads, d, hw = 3, 16, (5, 7)
    rope = RoPEMixed(d, heads)
    x = torch.randn(2, heads, hw[0] * hw[1], d)
    t_x, t_y = get_mixed_grid(list(hw), grid_indexing='xy')
    emb = get_mixed_freqs(rope.freqs.detach(), t_x, t_y)
    theirs = apply_rot_embed_cat(x, emb)
    perm = torch.cat([torch.arange(0, d // 2, 2), torch.arange(1, d // 2, 2),
                      torch.arange(d // 2, d, 2),
                      torch.arange(d // 2 + 1, d, 2)])
    ours = apply_rope2d(x[..., perm], *rope(hw))
    torch.testing.assert_close(ours, theirs[..., perm], atol=_F32_ATOL,
                               rtol=0)


@pytest.mark.parametrize('head_dim', [6, 2, 0, -4, 8.0])
def test_bad_head_dim(head_dim):
    with pytest.raises(ValueError, match=repr(head_dim)):
        RoPEMixed(head_dim, 2)


def test_bad_num_heads_theta_and_checkpoint_heads():
    with pytest.raises(ValueError, match='num_heads'):
        RoPEMixed(8, 0)
    with pytest.raises(ValueError, match='theta'):
        RoPEMixed(8, 2, theta=0.)
    with pytest.raises(ValueError, match='num_heads=2'):
        RoPEMixed(8, 2).load_state_dict({'freqs': torch.zeros(2, 3, 4)})
