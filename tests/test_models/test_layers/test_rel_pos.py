"""ViTDet's decomposed relative position (``DecomposedRelPos`` and its
relative term) in the attention core.

Expected values come from the equations, written here: MViTv2 (Li et al.,
CVPR 2022, Eq. 4-5) as ViTDet's released code applies them,
``e_ij = (q_i / sqrt(d)) . k_j + q_i . R_h[iy - jy] + q_i . R_w[ix - jx]``
with the UNscaled query, built pair by pair with the table rows indexed by
the offsets; the tables resized to ``2 h - 1`` / ``2 w - 1`` rows by linear
interpolation at half-pixel centres written with ``np.interp`` (what
``F.interpolate(mode='linear', align_corners=False)`` in ViTDet's
``get_rel_pos`` computes; checked against that library call too).
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmpe.models.layers import (DecomposedRelPos, PEAttention, RoPE2D,
                                resize_rel_pos)

# float64 throughout: the backends and the loop add the same terms in
# other orders
F64_TOL = dict(atol=1e-10, rtol=1e-9)
# float32 tables (std 0.02): source coordinates rounded in float32
F32_TOL = dict(atol=1e-7, rtol=1e-5)
# grid 3 x 5 (15 tokens, not a multiple of the chunk of 4); tables made for
# (4, 2): the row table is shrunk 7 -> 5 rows, the column table grown 3 -> 9
GRID, INPUT_SIZE, CHUNK = (3, 5), (4, 2), 4
HEAD_DIM = 8  # sqrt(8) is not a power of two: the q / sqrt(d) rounding shows


def interp_matrix(size: int, length: int) -> np.ndarray:
    """(length, size): row o interpolates the table linearly at
    ``(o + 0.5) size / length - 0.5`` (half-pixel centres), clamped to the
    first / last row, as ``np.interp`` does outside its range."""
    src = (np.arange(length) + 0.5) * size / length - 0.5
    eye = np.eye(size)
    return np.stack(
        [np.interp(src, np.arange(size), eye[:, c]) for c in range(size)], 1)


def resized(table: torch.Tensor, length: int) -> torch.Tensor:
    """The reference resize (differentiable in ``table``)."""
    m = torch.from_numpy(interp_matrix(table.shape[0], length))
    return m.to(table.dtype) @ table


def loop_bias(q, table_h, table_w, grid):
    """(B, H, L, L): ``q_i . R_h[iy - jy + h - 1] + q_i . R_w[ix - jx + w -
    1]``, one (i, j) at a time, ``q`` unscaled."""
    h, w = grid
    r_h, r_w = resized(table_h, 2 * h - 1), resized(table_w, 2 * w - 1)
    n = h * w
    rows = []
    for i in range(n):
        iy, ix = divmod(i, w)
        row = []
        for j in range(n):
            jy, jx = divmod(j, w)
            rel = r_h[iy - jy + h - 1] + r_w[ix - jx + w - 1]  # (d, )
            row.append(q[:, :, i] @ rel)  # (B, H)
        rows.append(torch.stack(row, -1))
    return torch.stack(rows, 2)


def reference_attention(q, k, v, mask, table_h, table_w, grid):
    d = q.shape[-1]
    logits = (q / math.sqrt(d)) @ k.transpose(-1, -2)
    logits = logits + loop_bias(q, table_h, table_w, grid)
    if mask is not None:
        logits = logits.masked_fill(mask[:, None, None], float('-inf'))
    return logits.softmax(-1) @ v


def _inputs(grid=GRID, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1]
    q, k, v = (torch.randn(2, 2, n, HEAD_DIM, generator=g,
                           dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, -4:] = True  # the second image's last keys are padding
    return q, k, v, mask


def _core(impl, input_size=INPUT_SIZE, **kwargs):
    torch.manual_seed(0)
    core = PEAttention(2 * HEAD_DIM, 2, attn_impl=impl, chunk_size=CHUNK,
                       rel_pos_cfg=dict(input_size=input_size), **kwargs)
    with torch.no_grad():  # non-zero tables, as after training
        core.rel_pos.table_h.normal_(0, 0.5)
        core.rel_pos.table_w.normal_(0, 0.5)
    return core.double()


# ------------------------------------------------------------- resizing
@pytest.mark.parametrize('size,length', [(7, 5), (3, 9), (5, 5), (1, 3),
                                         (9, 1), (27, 127)])
def test_resize_is_linear_interpolation(size, length):
    g = torch.Generator().manual_seed(size * 100 + length)
    table = torch.randn(size, 6, generator=g, dtype=torch.float64)
    got = resize_rel_pos(table, length)
    torch.testing.assert_close(got, resized(table, length), **F64_TOL)
    # the library call of ViTDet's get_rel_pos
    lib = F.interpolate(table.t()[None], size=length, mode='linear',
                        align_corners=False)[0].t()
    torch.testing.assert_close(got, lib, **F64_TOL)
    if size == length:  # the identity, bit for bit
        assert torch.equal(got, table)


def test_tables_resize_to_each_grid():
    module = DecomposedRelPos(HEAD_DIM, INPUT_SIZE, init='trunc_normal')
    assert module.table_h.shape == (7, HEAD_DIM)
    assert module.table_w.shape == (3, HEAD_DIM)
    for grid in (GRID, (4, 2), (1, 1), (6, 7)):
        r_h, r_w = module.tables(*grid)
        torch.testing.assert_close(
            r_h, resized(module.table_h.detach(), 2 * grid[0] - 1),
            **F32_TOL)
        torch.testing.assert_close(
            r_w, resized(module.table_w.detach(), 2 * grid[1] - 1),
            **F32_TOL)


# ---------------------------------------------------------- the term
@pytest.mark.parametrize('grid', [GRID, INPUT_SIZE, (1, 4)],
                         ids=['resized', 'own-size', 'one-row'])
def test_module_term_equals_pair_loop(grid):
    module = DecomposedRelPos(HEAD_DIM, INPUT_SIZE).double()
    with torch.no_grad():
        module.table_h.normal_()
        module.table_w.normal_()
    q = _inputs(grid)[0].requires_grad_(True)
    got = module(q, *grid)
    q_ref = q.detach().clone().requires_grad_(True)
    tables = [t.detach().clone().requires_grad_(True)
              for t in (module.table_h, module.table_w)]
    want = loop_bias(q_ref, *tables, grid)
    torch.testing.assert_close(got, want, **F64_TOL)
    grad = torch.randn(got.shape, dtype=got.dtype)
    got.backward(grad)
    want.backward(grad)
    for a, b in zip((q, module.table_h, module.table_w), (q_ref, *tables)):
        torch.testing.assert_close(a.grad, b.grad, **F64_TOL)


@pytest.mark.parametrize('impl',
                         ['explicit', 'chunked', 'fused', 'auto', 'sdpa'])
@pytest.mark.parametrize('input_size', [INPUT_SIZE, GRID],
                         ids=['resized', 'own-size'])
def test_attention_equals_reference_forward_backward(impl, input_size):
    """Every backend (the chunked one with chunks of 4 rows of 15, the
    fused CPU kernel, which 'auto' takes here, SDPA with the term as its
    float mask), forward and the gradients of q, k, v and both tables, with
    a key padding mask."""
    core = _core(impl, input_size)
    q, k, v, mask = _inputs()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = core.attend(*leaves, GRID, mask)
    refs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    tables = [t.detach().clone().requires_grad_(True)
              for t in (core.rel_pos.table_h, core.rel_pos.table_w)]
    ref = reference_attention(*refs, mask, *tables, GRID)
    torch.testing.assert_close(out, ref, **F64_TOL)
    grad = torch.randn(out.shape, dtype=out.dtype)
    out.backward(grad)
    ref.backward(grad)
    got = [t.grad for t in leaves] + [core.rel_pos.table_h.grad,
                                      core.rel_pos.table_w.grad]
    want = [t.grad for t in refs] + [t.grad for t in tables]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **F64_TOL)


@pytest.mark.parametrize('impl', ['auto', 'sdpa', 'explicit', 'chunked'])
def test_inference_equals_reference(impl):
    """Without gradients ('explicit' takes SDPA with a constant float
    mask; so does 'auto' where the fused CPU kernel does not apply, and the
    kernel otherwise: both equal the reference)."""
    core = _core(impl).eval()
    q, k, v, mask = _inputs(seed=4)
    with torch.no_grad():
        assert core.select_backend(15, False) == (
            'chunked' if impl == 'chunked' else 'sdpa')
        out = core.attend(q, k, v, GRID, mask)
        ref = reference_attention(q, k, v, mask, core.rel_pos.table_h,
                                  core.rel_pos.table_w, GRID)
    torch.testing.assert_close(out, ref, **F64_TOL)


def test_zero_tables_are_plain_attention():
    """ViTDet's zero initialisation: the term adds nothing."""
    core = PEAttention(16, 2, rel_pos_cfg=dict(input_size=4)).double()
    plain = PEAttention(16, 2).double()
    q, k, v, mask = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            core.attend(q, k, v, GRID, mask), plain.attend(q, k, v, GRID,
                                                           mask), **F64_TOL)


# --------------------------------------------------------- checkpoints
def test_tables_of_another_grid_load_resized():
    """A checkpoint made for another input size (e.g. ViTDet's 64 x 64
    global tables into a model built for 14 x 14) loads with each table
    resized linearly to this module's rows."""
    module = DecomposedRelPos(HEAD_DIM, (3, 5)).double()
    g = torch.Generator().manual_seed(7)
    state = dict(table_h=torch.randn(13, HEAD_DIM, generator=g,
                                     dtype=torch.float64),
                 table_w=torch.randn(9, HEAD_DIM, generator=g,
                                     dtype=torch.float64))
    module.load_state_dict(dict(state), strict=True)
    torch.testing.assert_close(module.table_h.detach(),
                               resized(state['table_h'], 5), **F64_TOL)
    assert torch.equal(module.table_w.detach(), state['table_w'])  # 9 rows
    # a table of another width is not a resize: it is refused as usual
    with pytest.raises(RuntimeError, match='size mismatch'):
        module.load_state_dict(dict(table_h=torch.zeros(5, 3),
                                    table_w=state['table_w']))


# -------------------------------------------------------------- errors
@pytest.mark.parametrize('kwargs,match', [
    (dict(input_size=0), r'`input_size` 0.*int > 0'),
    (dict(input_size=(3, )), r'`input_size` \(3,\)'),
    (dict(input_size=(3, 2.0)), r'`input_size` \(3, 2\.0\)'),
    (dict(input_size=True), r'`input_size` True'),
    (dict(input_size=3, init='xavier'),
     r"`init` 'xavier'.*\('zeros', 'trunc_normal'\)"),
    (dict(input_size=3, head_dim=0), r'`head_dim` 0'),
])
def test_bad_module_arguments(kwargs, match):
    kwargs.setdefault('head_dim', HEAD_DIM)
    with pytest.raises(ValueError, match=match):
        DecomposedRelPos(**kwargs)


def test_bad_attention_arguments():
    with pytest.raises(ValueError, match=r'`rel_pos_cfg`.*`rpe_cfg`'):
        PEAttention(16, 2, rel_pos_cfg=dict(input_size=3),
                    rpe_cfg=dict(mode='bias'))
    with pytest.raises(ValueError, match=r'`rel_pos_cfg` with skip=1'):
        PEAttention(16, 2, rel_pos_cfg=dict(input_size=3), skip=1)
    with pytest.raises(ValueError, match=r'`rel_pos_cfg.head_dim`'):
        PEAttention(16, 2, rel_pos_cfg=dict(input_size=3, head_dim=8))
    core = _core('explicit')
    q, k, v, mask = _inputs()
    with pytest.raises(ValueError, match=r'`spatial_shape=\(height, width\)'):
        core.attend(q, k, v, None, mask)
    rope = RoPE2D(HEAD_DIM)(GRID, torch.device('cpu'), torch.float64)
    with pytest.raises(ValueError, match=r'`rel_pos_cfg` got `rope`'):
        core.attend(q, k, v, GRID, mask, rope=rope)
    with pytest.raises(ValueError, match=r'DecomposedRelPos expects'):
        core.rel_pos(q, 4, 4)
