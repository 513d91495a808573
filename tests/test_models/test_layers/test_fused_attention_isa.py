"""The fused kernel's per-instruction-set variants (baseline, AVX2,
AVX-512), their choice at run time and ``MMPE_KERNEL_ISA``.

Expected values: the dense reference of test_fused_attention.py (every
pair's bucket looked up one (i, j) at a time) and, at a length where the
vector loops run whole vectors and tails, the term gathered from a bucket
map built here from the per-axis tables (``ids[i, j] = rows[iy, jy] * Sx +
cols[ix, jx]``, iRPE's product method) with torch's softmax; gradients by
autograd through those references.
"""
import os
import os.path as osp
import platform
import subprocess
import sys

import pytest
import torch

import mmpe
from mmpe.models.layers import AxisValues
from mmpe.models.layers.attention import fused as fused_module
from mmpe.models.layers.attention.fused import (KERNEL_ISAS, choose_kernel_isa,
                                                fused_attention,
                                                runnable_kernel_isas)
from test_fused_attention import (F32_TOL, F64_TOL, _dense_reference,
                                  _random_term)

RUNNABLE = runnable_kernel_isas()
X86 = platform.machine() in ('x86_64', 'AMD64')


def test_build_has_every_variant_of_its_architecture():
    """x86-64: baseline, AVX2, AVX-512; elsewhere the baseline only. This
    CPU runs the baseline and a prefix of the wider ones."""
    compiled = tuple(fused_module._ext.compiled_isas())
    assert compiled == (KERNEL_ISAS if X86 else ('baseline', ))
    assert RUNNABLE == compiled[:len(RUNNABLE)] and RUNNABLE[0] == 'baseline'


def _leaves(tensors):
    return [t.clone().requires_grad_(True) for t in tensors]


@pytest.mark.parametrize('isa', RUNNABLE)
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('layout', ['product', 'cross'])
@pytest.mark.parametrize('broadcast', [False, True],
                         ids=['per-token', 'bias'])
def test_variant_equals_dense_reference(isa, dtype, layout, broadcast):
    """Each variant this CPU runs: terms on keys, queries and values, one
    class token, a float mask with padded keys, blocks of 8 rows; a 5 x 7
    grid (36 tokens: rows of 7, vector tails everywhere). Output and the
    gradients of q, k, v and every term's values; float32 against the
    float64 reference of the same (float32) inputs."""
    g = torch.Generator().manual_seed(len(layout) + broadcast)
    grid, skip = (5, 7), 1
    n = skip + grid[0] * grid[1]
    base = _random_term(grid, layout, skip, broadcast, g)
    terms = [base._replace(on=on, values=_random_term(
        grid, layout, skip, broadcast, g, on=on).values) for on in 'kqv']
    q, k, v = (torch.randn(2, 3, n, 5, generator=g, dtype=dtype)
               for _ in range(3))
    mask = torch.randn(2, 1, n, n, generator=g, dtype=dtype)
    mask[1, :, :, -3:] = float('-inf')  # padded keys of the second image
    values = [t.values.to(dtype) for t in terms]
    grad = torch.randn(2, 3, n, 5, generator=g, dtype=dtype)
    got = _leaves([q, k, v] + values)
    out = fused_attention(*got[:3], mask, [
        t._replace(values=x) for t, x in zip(terms, got[3:])
    ], block_rows=8, isa=isa)
    out.backward(grad)
    ref_leaves = _leaves([x.double() for x in [q, k, v] + values])
    ref = _dense_reference(*ref_leaves[:3], mask.double(), [
        t._replace(values=x) for t, x in zip(terms, ref_leaves[3:])
    ])
    ref.backward(grad.double())
    tol = F64_TOL if dtype == torch.float64 else F32_TOL
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref.detach(), **tol)
    for a, b in zip(got, ref_leaves):
        torch.testing.assert_close(a.grad.double(), b.grad, **tol)


def _gathered_reference(q, k, v, values, rows, cols, sx):
    """Product-method term on keys from a bucket map built with torch ops:
    ``e_ij = q_i . k_j + c_i[rows[iy, jy] * Sx + cols[ix, jx]]``."""
    h, w = rows.shape[0], cols.shape[0]
    ids = (rows[:, None, :, None] * sx + cols[None, :, None, :]).reshape(
        h * w, h * w)
    b, heads, n, _ = q.shape
    term = values.gather(-1, ids.expand(b, heads, n, n))
    return ((q @ k.transpose(-1, -2) + term).softmax(-1)) @ v


@pytest.mark.parametrize('isa', RUNNABLE)
def test_variant_float32_at_length_255(isa):
    """A 15 x 17 grid (255 tokens, automatic blocks): the float32 exp and
    row loops over whole vectors and a tail of every width, forward and
    backward, against the float64 gathered reference."""
    g = torch.Generator().manual_seed(7)
    h, w, sy, sx = 15, 17, 5, 6
    n = h * w
    rows = torch.randint(0, sy, (h, h), generator=g)
    cols = torch.randint(0, sx, (w, w), generator=g)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for _ in range(3))
    values = torch.randn(1, 2, n, sy * sx, generator=g)
    grad = torch.randn(1, 2, n, 16, generator=g)
    got = _leaves([q, k, v, values])
    out = fused_attention(*got[:3], None, [
        AxisValues(got[3], rows, cols, 'product', sy, sx)], isa=isa)
    out.backward(grad)
    ref_leaves = _leaves([x.double() for x in (q, k, v, values)])
    ref = _gathered_reference(*ref_leaves, rows, cols, sx)
    ref.backward(grad.double())
    torch.testing.assert_close(out.double(), ref.detach(), **F32_TOL)
    for a, b in zip(got, ref_leaves):
        torch.testing.assert_close(a.grad.double(), b.grad, **F32_TOL)


def test_kernel_refuses_unknown_and_unrunnable_variants():
    """The extension's own check: a name this build lacks, a variant this
    CPU cannot run (where there is one) give errors, never a crash."""
    g = torch.Generator().manual_seed(0)
    term = _random_term((3, 4), 'product', 0, False, g)
    q = torch.randn(2, 3, 12, 5, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="unknown kernel variant 'sse9'"):
        fused_attention(q, q, q, None, [term], isa='sse9')
    for isa in set(fused_module._ext.compiled_isas()) - set(RUNNABLE):
        with pytest.raises(RuntimeError, match='cannot run'):
            fused_attention(q, q, q, None, [term], isa=isa)


def test_choose_kernel_isa():
    """The widest runnable variant by default, a named one on request; an
    unknown name lists the choices; a variant the CPU lacks (a CPU without
    AVX-512 here) names what it runs."""
    cpu = ('baseline', 'avx2')
    assert choose_kernel_isa(None, cpu) == 'avx2'
    assert choose_kernel_isa('', KERNEL_ISAS) == 'avx512'
    assert choose_kernel_isa('baseline', cpu) == 'baseline'
    with pytest.raises(ValueError,
                       match="'AVX2'.*choose one of baseline, avx2, avx512"):
        choose_kernel_isa('AVX2', cpu)
    with pytest.raises(RuntimeError,
                       match="'avx512'.*cannot run.*runs baseline, avx2"):
        choose_kernel_isa('avx512', cpu)


_SCRIPT = """
import os, torch
from mmpe.models.layers import AxisValues
from mmpe.models.layers.attention.fused import fused_attention, kernel_isa
q = torch.randn(1, 1, 6, 4)
term = AxisValues(torch.randn(1, 1, 6, 4), torch.zeros(2, 2).long(),
                  torch.zeros(3, 3).long(), 'product', 2, 2)
os.environ['MMPE_KERNEL_ISA'] = 'sse9'
try:
    fused_attention(q, q, q, None, [term])
except ValueError as e:
    print('ERROR', e)
os.environ['MMPE_KERNEL_ISA'] = 'baseline'
fused_attention(q, q, q, None, [term])
fused_attention(q, q, q, None, [term])
print('CHOSEN', kernel_isa())
"""


def test_environment_variable_and_log_line():
    """In a fresh process: an unknown MMPE_KERNEL_ISA fails the call with
    the choices; MMPE_KERNEL_ISA=baseline is taken and logged once for
    every call after."""
    env = dict(os.environ, OMP_NUM_THREADS='1')
    root = osp.dirname(osp.dirname(mmpe.__file__))
    env['PYTHONPATH'] = os.pathsep.join(
        [root] + [p for p in [env.get('PYTHONPATH')] if p])
    res = subprocess.run([sys.executable, '-c', _SCRIPT], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = (res.stdout + res.stderr).splitlines()
    assert ("ERROR MMPE_KERNEL_ISA='sse9' is not a kernel variant; choose "
            'one of baseline, avx2, avx512') in lines
    assert 'CHOSEN baseline' in lines
    logged = [x for x in lines if 'mmpe fused CPU attention kernel' in x]
    assert len(logged) == 1, lines
    assert logged[0].endswith(
        'the baseline variant (MMPE_KERNEL_ISA=baseline)')
