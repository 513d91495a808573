"""The offset biases (Swin-V2's log-CPB, 2D ALiBi, LookHere) inside the
attention core, on every backend: explicit, chunked (chunks that do not
divide L), the fused CPU kernel, SDPA (the term as its float mask),
``'auto'``, and the CUDA kernel (Triton; in its interpreter on CPU where no
GPU is). Forward and the gradients of q, k, v and log-CPB's MLP, square
and non-square grids, with and without a class token, padded keys; a
reference with the heads' tables in another order must not match.

Expected values: ``softmax(q k^T / sqrt(d) + B + mask) v`` with ``B``
from the per-pair loops of ``tests/grid_bias_reference.py`` (the papers'
equations and the released code), in float64. Outputs are compared, and
output gradients given, on the rows a loss can read (``read_rows``: all
but LookHere's padded queries whose unmasked keys are all padding, where
the released fill and mmpe's differ by design, lookhere.py); those rows
must still be finite on every backend.
"""
import warnings

import pytest
import torch

from grid_bias_reference import (alibi_loop, attention, log_cpb_loop,
                                 lookhere_loop, read_rows)
from mmpe.models.layers import PEAttention
from mmpe.models.layers.attention.backends import choice
from mmpe.models.layers.attention.fused_triton import interpreted

# float64 backends against the float64 reference: the same terms summed in
# other orders
F64_TOL = dict(atol=1e-10, rtol=1e-9)
# the Triton kernel in float32 against float64: float32 products, online
# softmax and atomic bucket sums; the absolute part scaled by the tensor's
# largest value (log-CPB's MLP gradients sum every pair)
F32_TOL = dict(atol=5e-5, rtol=2e-4)
ENCODINGS = {
    'log-cpb': dict(type='log-cpb', pretrained_size=(4, 6), hidden=16),
    'alibi-2d': dict(type='alibi-2d'),
    'lookhere': dict(type='lookhere', directions='corners', global_slope=.5),
}
HEADS, HEAD_DIM, CHUNK = 4, 4, 4
# (grid, skip tokens): 15 tokens, and 1 + 16 with a class token
SETTINGS = [((3, 5), 0), ((4, 4), 1)]


def _core(name, impl, skip, dtype=torch.float64):
    torch.manual_seed(0)
    core = PEAttention(HEADS * HEAD_DIM, HEADS, attn_impl=impl,
                       chunk_size=CHUNK, skip=skip,
                       bias_cfg=ENCODINGS[name]).to(dtype)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # log-CPB: weights away from the init
        for p in core.grid_bias.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return core


def _reference_bias(core, name, grid):
    """(bias (H, L0, L0), its leaves): the loop of the module's encoding
    with the module's weights as fresh leaves."""
    if name == 'log-cpb':
        mlp = core.grid_bias.cpb_mlp
        leaves = [p.detach().double().clone().requires_grad_(True)
                  for p in (mlp[0].weight, mlp[0].bias, mlp[2].weight)]
        return log_cpb_loop(*leaves, grid, (4, 6)), leaves
    if name == 'alibi-2d':
        return alibi_loop(HEADS, grid), []
    return lookhere_loop('corners', HEADS, grid, global_slope=.5), []


def _inputs(grid, skip, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = skip + grid[0] * grid[1]
    q, k, v = (torch.randn(2, HEADS, n, HEAD_DIM, generator=g,
                           dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, -4:] = True  # the second image's last keys are padding
    return q, k, v, mask


def _out_grad(core, name, grid, skip, mask):
    """The output gradient: random, on the rows a loss can read
    (``read_rows``)."""
    n = skip + grid[0] * grid[1]
    grad = torch.randn(2, HEADS, n, HEAD_DIM,
                       generator=torch.Generator().manual_seed(2),
                       dtype=torch.float64)
    bias = _reference_bias(core, name, grid)[0].detach()
    return grad * read_rows(bias, mask, skip)


def _run(core, name, grid, skip, dtype=torch.float64):
    """Output and gradients of q, k, v and the bias's parameters."""
    q, k, v, mask = _inputs(grid, skip)
    leaves = [t.clone().to(dtype).requires_grad_(True) for t in (q, k, v)]
    out = core.attend(*leaves, grid, mask)
    out.backward(_out_grad(core, name, grid, skip, mask).to(dtype))
    return [out] + [t.grad for t in leaves] + [
        p.grad for p in core.grid_bias.parameters()]


def _expected(core, name, grid, skip):
    """The reference's output (on the rows a loss reads, ``read_rows``),
    gradients and the control's output."""
    q, k, v, mask = _inputs(grid, skip)
    bias, bias_leaves = _reference_bias(core, name, grid)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attention(*leaves, bias, mask, skip)
    out.backward(_out_grad(core, name, grid, skip, mask))
    rows = read_rows(bias.detach(), mask, skip)
    control = attention(q, k, v, bias.detach().flip(0), mask, skip)
    return [out.detach() * rows] + [t.grad for t in leaves] + [
        t.grad for t in bias_leaves], control * rows, rows


@pytest.mark.parametrize('impl',
                         ['explicit', 'chunked', 'fused', 'sdpa', 'auto'])
@pytest.mark.parametrize('grid,skip', SETTINGS, ids=['3x5', '4x4-cls'])
@pytest.mark.parametrize('name', list(ENCODINGS))
def test_every_backend_equals_reference(name, grid, skip, impl):
    core = _core(name, impl, skip)
    with warnings.catch_warnings():
        # 'fused' must not fall back: the kernel takes the product layout
        warnings.simplefilter('error', UserWarning)
        got = _run(core, name, grid, skip)
    want, control, rows = _expected(core, name, grid, skip)
    assert torch.isfinite(got[0]).all()  # also the rows no loss reads
    got[0] = got[0] * rows
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **F64_TOL)
    assert not torch.allclose(got[0], control, **F64_TOL)


@pytest.mark.parametrize('impl', ['auto', 'explicit', 'chunked', 'fused'])
@pytest.mark.parametrize('name', list(ENCODINGS))
def test_inference_equals_reference(name, impl):
    """Without gradients (``'auto'``: the fused kernel; ``'explicit'``:
    SDPA with the term as a constant mask)."""
    grid, skip = SETTINGS[1]
    core = _core(name, impl, skip).eval()
    q, k, v, mask = _inputs(grid, skip, seed=4)
    with torch.no_grad():
        out = core.attend(q, k, v, grid, mask)
    bias, _ = _reference_bias(core, name, grid)
    want = attention(q, k, v, bias.detach(), mask, skip)
    rows = read_rows(bias.detach(), mask, skip)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out * rows, want * rows, **F64_TOL)


@pytest.mark.skipif(not (interpreted() or torch.cuda.is_available()),
                    reason='Triton kernels need CUDA or TRITON_INTERPRET=1')
@pytest.mark.parametrize('grid,skip', SETTINGS, ids=['3x5', '4x4-cls'])
@pytest.mark.parametrize('name', list(ENCODINGS))
def test_triton_kernel_equals_reference(name, grid, skip, monkeypatch):
    """The CUDA kernel (float32; on CPU tensors in Triton's interpreter)
    through ``attn_impl='fused'`` against the float64 reference."""
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if device == 'cpu':
        monkeypatch.setattr(choice, 'fused_backend', lambda _: 'fused-cuda')
    core = _core(name, 'fused', skip, torch.float32).to(device)
    q, k, v, mask = (t.to(device) for t in _inputs(grid, skip))
    leaves = [t.float().requires_grad_(True) for t in (q, k, v)]
    with warnings.catch_warnings():  # no fallback
        warnings.simplefilter('error', UserWarning)
        out = core.attend(*leaves, grid, mask)
    out.backward(_out_grad(core, name, grid, skip, mask.cpu()).float().to(
        device))
    got = [out] + [t.grad for t in leaves] + [
        p.grad for p in core.grid_bias.parameters()]
    monkeypatch.undo()
    want, control, rows = _expected(core.cpu(), name, grid, skip)
    assert torch.isfinite(got[0]).all()  # also the rows no loss reads
    got[0] = got[0].double().cpu() * rows
    for a, b in zip(got, want):
        scale = max(1.0, float(b.abs().max()))
        torch.testing.assert_close(a.double().cpu(), b, rtol=F32_TOL['rtol'],
                                   atol=F32_TOL['atol'] * scale)
    assert not torch.allclose(got[0].double().cpu(), control, atol=1e-3)


def test_zero_bias_of_class_token_pairs():
    """The class token's row and column of the term are 0 (the released
    LookHere map's padding; timm's RelPosMlp's prefix tokens)."""
    core = _core('lookhere', 'explicit', 1)
    q = torch.zeros(1, HEADS, 1 + 9, HEAD_DIM, dtype=torch.float64)
    dense = core.grid_bias.term(q, 3, 3).dense()[0][0]
    assert dense[:, 0].abs().max() == 0 and dense[:, :, 0].abs().max() == 0
    assert dense[:, 1:, 1:].abs().max() > 0


def test_refused_with_another_relative_position():
    with pytest.raises(ValueError, match=r'`bias_cfg`.*one relative'):
        PEAttention(16, 4, bias_cfg=dict(type='alibi-2d'),
                    rpe_cfg=dict(mode='bias'))
    with pytest.raises(ValueError, match=r'`bias_cfg`.*one relative'):
        PEAttention(16, 4, bias_cfg=dict(type='alibi-2d'),
                    rel_pos_cfg=dict(input_size=3))
    core = _core('alibi-2d', 'explicit', 0)
    q, k, v, mask = _inputs((3, 5), 0)
    with pytest.raises(ValueError, match=r'bias_cfg on\); got None'):
        core.attend(q, k, v, None, mask)
