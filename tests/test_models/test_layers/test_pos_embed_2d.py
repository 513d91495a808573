"""2D sin-cos, learnable-table resampling and 2D RoPE against loop formulas."""
import math

import pytest
import torch

from mmpe.models.layers import (BoundedCache, RoPE2D, SinCosPosEmbed2D,
                                apply_rope2d, build_rope2d,
                                build_sincos_pos_embed_2d, resample_pos_embed)

_TRIG_ATOL = 1e-5  # sin/cos of angles up to ~30 rad in float32
_F64_ATOL = 1e-10  # float64, only summation order differs


# --------------------------------------------------------------------- sine
def sincos_reference(h, w, dims, temperature):
    quarter = dims // 4
    table = torch.zeros(h * w, dims, dtype=torch.float64)
    for y in range(h):
        for x in range(w):
            for i in range(quarter):
                omega = temperature**(-i / quarter)
                n = y * w + x
                table[n, i] = math.sin(x * omega)
                table[n, quarter + i] = math.cos(x * omega)
                table[n, 2 * quarter + i] = math.sin(y * omega)
                table[n, 3 * quarter + i] = math.cos(y * omega)
    return table


@pytest.mark.parametrize('hw', [(1, 1), (3, 5), (7, 2), (1, 9)])
@pytest.mark.parametrize('dims', [4, 16, 24])
@pytest.mark.parametrize('temperature', [10000., 20.])
def test_sincos_matches_formula(hw, dims, temperature):
    table = build_sincos_pos_embed_2d(hw, dims, temperature)
    assert table.shape == (hw[0] * hw[1], dims)
    assert table.dtype == torch.float32
    ref = sincos_reference(*hw, dims, temperature).float()
    torch.testing.assert_close(table, ref, atol=_TRIG_ATOL, rtol=0)


def test_sincos_token_keeps_embedding_when_grid_grows():
    small = build_sincos_pos_embed_2d((3, 4), 8).reshape(3, 4, 8)
    big = build_sincos_pos_embed_2d((5, 6), 8).reshape(5, 6, 8)
    torch.testing.assert_close(big[:3, :4], small, atol=0, rtol=0)


def test_sincos_module_cache_and_errors():
    module = SinCosPosEmbed2D(8, cache_size=4)
    a = module((3, 4), torch.device('cpu'), torch.float32)
    assert module((3, 4), torch.device('cpu'), torch.float32) is a
    b = module((3, 4), torch.device('cpu'), torch.float64)
    assert b.dtype == torch.float64 and b is not a
    for n in range(1, 20):
        module((n, n + 1), torch.device('cpu'), torch.float32)
    assert len(module.cache) == 4
    assert not list(module.parameters())
    with pytest.raises(ValueError, match='multiple of 4'):
        SinCosPosEmbed2D(6)
    with pytest.raises(ValueError, match='temperature'):
        SinCosPosEmbed2D(8, temperature=0.)
    with pytest.raises(ValueError, match='cache_size'):
        BoundedCache(0)


def test_bounded_cache_is_lru():
    cache = BoundedCache(2)
    cache.get('a', lambda: 1)
    cache.get('b', lambda: 2)
    cache.get('a', lambda: 0)  # touch a, so b is the oldest
    cache.get('c', lambda: 3)
    assert cache.get('a', lambda: -1) == 1
    assert cache.get('b', lambda: -2) == -2  # was evicted


# ---------------------------------------------------------------- learnable
@pytest.mark.parametrize('num_skip', [0, 1, 2])
def test_resample_identity_at_native_size(num_skip):
    table = torch.randn(1, num_skip + 4 * 5, 6)
    assert resample_pos_embed(table, (4, 5), (4, 5), num_skip) is table


@pytest.mark.parametrize('num_skip', [0, 1])
@pytest.mark.parametrize('dst', [(7, 3), (2, 2), (14, 14), (1, 9)])
def test_resample_shape_and_skip_rows(num_skip, dst):
    table = torch.randn(1, num_skip + 4 * 5, 6, requires_grad=True)
    out = resample_pos_embed(table, (4, 5), dst, num_skip)
    assert out.shape == (1, num_skip + dst[0] * dst[1], 6)
    torch.testing.assert_close(out[:, :num_skip], table[:, :num_skip])
    out.sum().backward()
    assert torch.isfinite(table.grad).all()


@pytest.mark.parametrize('dst', [(7, 3), (2, 2), (9, 11)])
def test_resample_matches_interpolate_and_keeps_constants(dst):
    grid = torch.randn(1, 6, 4, 5)  # (1, C, h0, w0)
    table = grid.flatten(2).transpose(1, 2)
    out = resample_pos_embed(table, (4, 5), dst)
    ref = torch.nn.functional.interpolate(
        grid, size=dst, mode='bicubic', align_corners=False, antialias=True)
    torch.testing.assert_close(out, ref.flatten(2).transpose(1, 2))
    const = torch.full((1, 20, 3), 0.7)
    torch.testing.assert_close(
        resample_pos_embed(const, (4, 5), dst),
        torch.full((1, dst[0] * dst[1], 3), 0.7),
        atol=1e-5,
        rtol=0)


def test_resample_bad_length():
    with pytest.raises(ValueError, match='table length'):
        resample_pos_embed(torch.randn(1, 21, 4), (4, 5), (2, 2))


# -------------------------------------------------------------------- rope
def rope_reference(vec, y, x, theta):
    """Rotate one head vector at grid position (y, x), pair by pair."""
    d = vec.shape[-1]
    q = d // 4
    out = vec.clone()
    for j in range(q):
        freq = theta**(-j / q)
        for base, pos in ((0, x), (2 * q, y)):  # x half, then y half
            a, b = vec[base + j], vec[base + q + j]
            ang = pos * freq
            out[base + j] = a * math.cos(ang) - b * math.sin(ang)
            out[base + q + j] = b * math.cos(ang) + a * math.sin(ang)
    return out


@pytest.mark.parametrize('hw', [(3, 4), (1, 5), (4, 1)])
@pytest.mark.parametrize('head_dim', [4, 8, 16])
@pytest.mark.parametrize('num_skip', [0, 1])
def test_rope_matches_loop_reference(hw, head_dim, num_skip):
    h, w = hw
    theta = 10.
    x = torch.randn(2, 3, num_skip + h * w, head_dim, dtype=torch.float64)
    cos, sin = build_rope2d(hw, head_dim, theta, dtype=torch.float64)
    assert cos.shape == sin.shape == (h * w, head_dim)
    out = apply_rope2d(x, cos, sin, num_skip)
    assert torch.equal(out[..., :num_skip, :], x[..., :num_skip, :])
    for b in range(2):
        for head in range(3):
            for yy in range(h):
                for xx in range(w):
                    n = num_skip + yy * w + xx
                    torch.testing.assert_close(
                        out[b, head, n],
                        rope_reference(x[b, head, n], yy, xx, theta),
                        atol=_F64_ATOL,
                        rtol=0)


@pytest.mark.parametrize('theta', [100., 10000.])
@pytest.mark.parametrize('head_dim', [8, 16])
def test_rope_score_depends_only_on_offset(theta, head_dim):
    """<R_m q, R_n k> is a function of n - m: one q and one k everywhere."""
    h, w = 4, 5
    q = torch.randn(head_dim, dtype=torch.float64)
    k = torch.randn(head_dim, dtype=torch.float64)
    cos, sin = build_rope2d((h, w), head_dim, theta, dtype=torch.float64)
    # (1, 1, L, D): the same vector placed at every grid position
    rq = apply_rope2d(q.expand(1, 1, h * w, head_dim), cos, sin)[0, 0]
    rk = apply_rope2d(k.expand(1, 1, h * w, head_dim), cos, sin)[0, 0]
    scores = rq @ rk.T  # (L, L)
    by_offset = {}
    for m in range(h * w):
        for n in range(h * w):
            offset = (n // w - m // w, n % w - m % w)
            by_offset.setdefault(offset, []).append(scores[m, n])
    assert len(by_offset) == (2 * h - 1) * (2 * w - 1)
    for offset, values in by_offset.items():
        values = torch.stack(values)
        torch.testing.assert_close(
            values, values[:1].expand_as(values), atol=_F64_ATOL, rtol=0)
    # same position: the rotation cancels
    torch.testing.assert_close(
        torch.diagonal(scores), (q @ k).expand(h * w),
        atol=_F64_ATOL,
        rtol=0)
    # the encoding is not trivial: x and y offsets are told apart
    assert not torch.allclose(by_offset[(0, 1)][0], by_offset[(1, 0)][0])


def test_rope_preserves_norm_and_gradient():
    cos, sin = build_rope2d((3, 3), 8, dtype=torch.float64)
    x = torch.randn(1, 2, 10, 8, dtype=torch.float64, requires_grad=True)
    out = apply_rope2d(x, cos, sin, num_skip=1)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    assert torch.autograd.gradcheck(
        lambda t: apply_rope2d(t, cos, sin, num_skip=1), (x, ))


def test_rope_module_cache_and_errors():
    module = RoPE2D(8, cache_size=3)
    a = module((2, 3), torch.device('cpu'), torch.float32)
    assert module((2, 3), torch.device('cpu'), torch.float32) is a
    for n in range(1, 10):
        module((n, 2), torch.device('cpu'), torch.float32)
    assert len(module.cache) == 3
    with pytest.raises(ValueError, match='multiple of 4'):
        RoPE2D(6)
    with pytest.raises(ValueError, match='theta'):
        RoPE2D(8, theta=-1.)
    cos, sin = build_rope2d((2, 2), 8)
    with pytest.raises(ValueError, match='sequence length'):
        apply_rope2d(torch.randn(1, 1, 5, 8), cos, sin, num_skip=0)
