"""The fused CPU kernel on bfloat16 / float16 inputs (float32 arithmetic,
outputs and gradients in the input dtype), and its choice by the attention
core under CPU autocast.

Expected values: the dense reference of test_fused_attention.py (every
pair's bucket looked up one (i, j) at a time) in float64 on the inputs
rounded to the low-precision dtype, so that only the kernel's own rounding
of its results is measured; under autocast, the explicit backend in
float32.
"""
import pytest
import torch

from mmpe.models.layers import ViTAttention
from mmpe.models.layers.attention.fused import fused_attention
from test_fused_attention import _Count, _dense_reference, _random_term

#: one unit in the last place, relative: bfloat16 keeps 8 significant bits,
#: float16 11. The kernel rounds its float32 result once; a value near a
#: rounding boundary may round to the other neighbour than the exact one.
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def _close(got, ref, dtype):
    """``got`` (the kernel's, in ``dtype``) against the float64 reference:
    one ulp of ``dtype`` relative, and in absolute terms one ulp of the
    tensor's largest entry. The latter covers the gradients: the backward
    reads the output as rounded to ``dtype`` (in D_i = dO_i . O_i), an
    error of up to an ulp of |dO_i| |O_i| that dE = P (dP - D) carries into
    every gradient of the row, and entries near zero (sums of terms of both
    signs) keep that absolute error."""
    assert got.dtype == dtype
    ulp = ULP[dtype]
    torch.testing.assert_close(got.double(), ref, rtol=ulp,
                               atol=ulp * ref.abs().max().item())


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('layout', ['product', 'cross'])
@pytest.mark.parametrize('broadcast', [False, True],
                         ids=['per-token', 'bias'])
def test_low_precision_equals_reference_on_rounded_inputs(
        dtype, layout, broadcast):
    """Terms on keys, queries and values, one class token, a float mask
    with padded keys, blocks of 8 rows: output and the gradients of q, k,
    v and every term's values, all in ``dtype``."""
    g = torch.Generator().manual_seed(len(layout) + broadcast)
    grid, skip = (5, 7), 1
    n = skip + grid[0] * grid[1]
    base = _random_term(grid, layout, skip, broadcast, g)
    terms = [base._replace(on=on, values=_random_term(
        grid, layout, skip, broadcast, g, on=on).values.to(dtype))
             for on in 'kqv']
    q, k, v = (torch.randn(2, 3, n, 5, generator=g).to(dtype)
               for _ in range(3))
    mask = torch.randn(2, 1, n, n, generator=g).to(dtype)
    mask[1, :, :, -3:] = float('-inf')  # padded keys of the second image
    grad = torch.randn(2, 3, n, 5, generator=g).to(dtype)
    leaves = [t.clone().requires_grad_(True)
              for t in [q, k, v] + [t.values for t in terms]]
    out = fused_attention(*leaves[:3], mask, [
        t._replace(values=x) for t, x in zip(terms, leaves[3:])
    ], block_rows=8)
    out.backward(grad)
    refs = [t.double().requires_grad_(True)
            for t in [q, k, v] + [t.values for t in terms]]
    ref = _dense_reference(*refs[:3], mask.double(), [
        t._replace(values=x) for t, x in zip(terms, refs[3:])
    ])
    ref.backward(grad.double())
    _close(out, ref.detach(), dtype)
    for a, b in zip(leaves, refs):
        _close(a.grad, b.grad, dtype)


def test_autocast_bf16_runs_the_fused_kernel(monkeypatch):
    """A ViT attention layer (contextual product iRPE on keys, the default
    attn_impl='auto') under CPU bf16 autocast: the projections give
    bfloat16 q, k, v, and the fused kernel (not 'chunked') runs, in
    training; output and weight gradients close to float32's explicit
    backend."""
    count = _Count(monkeypatch)
    torch.manual_seed(0)
    kwargs = dict(rpe_on='k', rpe_cfg=dict(
        mode='contextual', method='product', ratio=1.0, init='xavier'))
    auto = ViTAttention(32, 2, **kwargs)
    explicit = ViTAttention(32, 2, attn_impl='explicit', **kwargs)
    explicit.load_state_dict(auto.state_dict())
    x = torch.randn(2, 20, 32)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = auto(x, (4, 5))
    assert count.calls == 1
    assert out.dtype == torch.bfloat16
    out.float().square().sum().backward()
    want = explicit(x, (4, 5))
    want.square().sum().backward()
    # bf16 projections, kernel inputs and output (8 significant bits each):
    # a few ulp of bfloat16 of the output's scale
    tol = 4 * ULP[torch.bfloat16]
    torch.testing.assert_close(out.float(), want.detach(), rtol=tol,
                               atol=tol * want.abs().max().item())
    for (name, p), q in zip(auto.named_parameters(), explicit.parameters()):
        scale = q.grad.abs().max().item()
        torch.testing.assert_close(p.grad, q.grad, rtol=tol,
                                   atol=4 * tol * scale, msg=name)


def test_custom_ops_pass_opcheck_in_bfloat16():
    """Schema, fake kernels (output and sums in bfloat16, the log-sum-exp
    in float32), autograd registration and dispatch with bfloat16 q, k, v
    and the mask and term values in float32, as fused_attention passes
    them (torch.library.opcheck)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 12, 4, generator=g).to(torch.bfloat16)
               for _ in range(3))
    values = torch.randn(2, 2, 12, 9, generator=g, requires_grad=True)
    rows = torch.randint(0, 3, (3, 3), generator=g)
    cols = torch.randint(0, 3, (4, 4), generator=g)
    mask = torch.zeros(2, 1, 1, 12)
    layout = [1, 3, 3, 3, 0, -1, -1]  # product 3 x 3, no skip tokens
    for with_sums in (False, True):
        args = (q.requires_grad_(), k, v, mask, values, None, with_sums, 9,
                rows, cols, layout, 0, 5, '')
        torch.library.opcheck(torch.ops.mmpe.fused_attention.default, args)
        out, lse, sums = torch.ops.mmpe.fused_attention(*args)
        assert (out.dtype, lse.dtype) == (torch.bfloat16, torch.float32)
        assert sums.dtype == torch.bfloat16
        torch.library.opcheck(
            torch.ops.mmpe.fused_attention_backward.default,
            (torch.randn_like(out),
             torch.randn_like(sums) if with_sums else None, q.detach(), k, v,
             out.detach(), lse.detach(), mask, values.detach(), None, 9,
             rows, cols, layout, 0, 5, ''))
