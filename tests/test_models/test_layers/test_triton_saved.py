"""What the fused Triton kernel keeps for its backward and where its
offsets stop: the bytes a call saves (``saved_tensors_hooks``) against
``F.scaled_dot_product_attention`` without a term, every store and atomic
add inside the tensors of its launch (Triton's interpreter, which checks
no bounds, with a check added around its stores), the refusal of per-head
offsets past 2^31, and the dropout's counters (the pair's two token
indices, not their product). Run in Triton's interpreter where no GPU is
(the conftest sets ``TRITON_INTERPRET=1``).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmpe.models.layers import PEAttention
from mmpe.models.layers.attention.backends import choice
from mmpe.models.layers import AxisValues
from mmpe.models.layers.attention import triton_launch
from mmpe.models.layers.attention.fused_triton import (dropout_mask,
                                                       interpreted,
                                                       triton_attention)
from mmpe.models.layers.attention.triton_launch import (INT32_LIMIT,
                                                        check_offsets)

pytestmark = pytest.mark.skipif(
    not (interpreted() or torch.cuda.is_available()),
    reason='Triton kernels need CUDA or TRITON_INTERPRET=1')

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
#: the aim: one term on keys, bfloat16, at most this times SDPA's bytes
SAVED_RATIO = 1.3
#: float32 atomic bucket sums of the same pairs, grouped by block or by
#: token: the same terms added in another order
SUMS_TOL = dict(atol=1e-5, rtol=1e-5)


def _saved_bytes(fn, *args) -> int:
    """Bytes of the distinct storages autograd saves for the backward of
    ``fn(*args)`` (a storage saved twice, e.g. q by the lookup and the
    kernel, counts once)."""
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(storages.values())


def test_saved_bytes_against_sdpa(monkeypatch):
    """ViT-S heads (6 x 64), an 8 x 8 grid, bfloat16; iRPE contextual
    product on k (the report's setting: piecewise, ratio 1.9): the fused
    call keeps q, k, v, out, the row log-sum-exp and the term's values in
    bfloat16; SDPA keeps q, k, v, out and its log-sum-exp."""
    if DEVICE == 'cpu':  # the CUDA backend, interpreted (as on CUDA)
        monkeypatch.setattr(choice, 'fused_backend', lambda _: 'fused-cuda')
    g = torch.Generator().manual_seed(0)
    n = 64
    q, k, v = (torch.randn(1, 6, n, 64, generator=g).to(DEVICE,
                                                         torch.bfloat16)
               .requires_grad_(True) for _ in range(3))
    torch.manual_seed(0)
    module = PEAttention(384, 6, attn_impl='fused', rpe_on='k', rpe_cfg=dict(
        mode='contextual', method='product', index='piecewise', ratio=1.9,
        shared_head=True, init='xavier')).to(DEVICE, torch.bfloat16)
    fused = _saved_bytes(lambda: module.attend(q, k, v, (8, 8)))
    sdpa = _saved_bytes(lambda: F.scaled_dot_product_attention(q, k, v))
    assert sdpa >= 4 * q.numel() * 2  # q, k, v, out at least
    assert fused / sdpa <= SAVED_RATIO, (fused, sdpa)


def test_offsets_past_int32_are_refused():
    """Per-head offsets (row x row stride + column) from 2^31 on are
    refused, naming the tensor; broadcast (stride-0) dims add nothing."""
    rows = 2**31 // 49 + 1  # tokens x 49 buckets passes 2^31
    # meta tensors: shapes and strides, no memory
    values = torch.empty_strided((1, 1, rows, 49), (0, 0, 49, 1),
                                 device='meta')
    with pytest.raises(ValueError, match=r'values_k of shape .*2\^31'):
        check_offsets(values_k=values)
    fits = torch.empty_strided((1, 1, rows - 2, 49), (0, 0, 49, 1),
                               device='meta')
    check_offsets(values_k=fits)
    bias = torch.empty_strided((1, 6, 10**9, 49), (0, 49, 0, 1),
                               device='meta')
    check_offsets(values_k=bias)  # one row of values per head
    # the last offset of each: (rows - 1) x 49 + 48
    assert (rows - 1) * 49 + 48 >= INT32_LIMIT > (rows - 3) * 49 + 48


def test_dropout_mask_is_keyed_by_the_pair_not_a_product():
    """The mask of pair (i, j) does not depend on the number of keys (the
    first kernels keyed it by ``i * L + j``, an int32 product that wraps
    past 46,340 tokens)."""
    seed = torch.tensor([123])
    short = dropout_mask(seed, 0.5, 1, 2, 5, 70, DEVICE).cpu()
    long = dropout_mask(seed, 0.5, 1, 2, 5, 200, DEVICE).cpu()
    torch.testing.assert_close(long[..., :70], short, rtol=0, atol=0)
    # and the rows differ from one another (no shared stream)
    assert not torch.equal(long[0, 0, 0], long[0, 0, 1])


def _term(grid, layout, skip, on, g, queries=None, shared=False):
    """Random tables and values of the AxisValues contract (as the kernel
    tests lay out iRPE's buckets: extras after the spatial ones);
    ``shared``: values (1, H, 1, nb) shared by every token (a bias
    table)."""
    h, w = grid
    n = skip + h * w
    sy, sx = (3, 4) if layout == 'product' else (2 * h - 1, 2 * w - 1)
    if layout == 'product':
        nb, extras, offset = sy * sx + 1, (sy * sx, ), None
    else:
        offset = sy + 1
        nb, extras = offset + sx + 1, (sy, offset + sx)
    qgrid = queries is None
    rows = torch.randint(0, sy, (h if qgrid else 1, h), generator=g)
    cols = torch.randint(0, sx, (w if qgrid else 1, w), generator=g)
    shape = ((1, 3, nb, 5) if on == 'v' else (1, 3, 1, nb) if shared else
             (2, 3, (queries or n) if on == 'k' else n, nb))
    values = torch.randn(shape, generator=g).requires_grad_(True)
    return AxisValues(values, rows, cols, layout, sy, sx, offset, skip,
                      extras if skip else (), on, qgrid)


@pytest.mark.skipif(not interpreted(), reason='checks the interpreter\'s '
                    'stores (on CUDA the GPU runs the kernels)')
@pytest.mark.parametrize('grid,layout,skip,ons,queries,shared', [
    ((3, 5), 'product', 1, 'q', None, False),  # query rows past the grid
    ((3, 5), 'cross', 2, 'qkv', None, False),
    ((3, 33), 'cross', 1, 'qkv', None, False),  # a row part per query row
    ((2, 64), 'product', 2, 'qkv', None, False),  # tiles of one grid row
    ((9, 8), 'product', 0, 'qkv', None, False),
    ((4, 21), 'cross', 0, 'k', 70, False),  # queries off the grid (BoxRPB)
    # bias tables: a gradient row per program's block, keys past the last
    # block into the scratch row
    ((9, 8), 'product', 1, 'qk', None, True),
])
def test_every_store_and_atomic_stays_inside_its_tensors(
        grid, layout, skip, ons, queries, shared, monkeypatch):
    """Forward and backward with padded keys: every address a kernel
    stores to or adds into lies inside a tensor of its launch (the first
    kernels' bucket of a row past the grid could point one row past its
    table's last)."""
    from triton.runtime import interpreter
    ranges = []

    def check(ptrs, mask):
        p = np.asarray(ptrs).reshape(-1)
        if mask is not None:
            p = p[np.asarray(mask).reshape(-1).astype(bool)]
        inside = np.zeros(p.shape, bool)
        for lo, hi in ranges:
            inside |= (p >= lo) & (p < hi)
        assert inside.all(), f'{int((~inside).sum())} addresses outside'

    builder = interpreter.InterpreterBuilder
    rmw, masked, plain = (builder.create_atomic_rmw,
                          builder.create_masked_store, builder.create_store)
    monkeypatch.setattr(builder, 'create_atomic_rmw', lambda self, op, ptr,
                        val, mask, *a: (check(ptr.data, mask.data),
                                        rmw(self, op, ptr, val, mask,
                                            *a))[1])
    monkeypatch.setattr(builder, 'create_masked_store', lambda self, ptr,
                        val, mask, *a: (check(ptr.data, mask.data),
                                        masked(self, ptr, val, mask,
                                               *a))[1])
    monkeypatch.setattr(builder, 'create_store', lambda self, ptr, val, *a:
                        (check(ptr.data, None), plain(self, ptr, val,
                                                      *a))[1])
    launch = triton_launch.Launch.__call__

    def call(self):
        ranges[:] = [(x.untyped_storage().data_ptr(),
                      x.untyped_storage().data_ptr() +
                      x.untyped_storage().nbytes())
                     for x in self.args if isinstance(x, torch.Tensor)]
        return launch(self)

    monkeypatch.setattr(triton_launch.Launch, '__call__', call)
    g = torch.Generator().manual_seed(len(ons) + skip)
    n = skip + grid[0] * grid[1]
    base = _term(grid, layout, skip, 'k', g, queries)
    terms = [base._replace(on=on, values=_term(grid, layout, skip, on, g,
                                               queries, shared).values)
             for on in ons]
    q = torch.randn(2, 3, queries or n, 16, generator=g).requires_grad_(True)
    k, v = (torch.randn(2, 3, n, 16 if i == 0 else 5,
                        generator=g).requires_grad_(True) for i in range(2))
    mask = torch.zeros(2, 1, 1, n)
    mask[1, ..., -3:] = float('-inf')
    out = triton_attention(q, k, v, mask, terms)
    out.backward(torch.randn(out.shape, generator=g))
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


def test_shared_values_get_a_gradient_row_per_block():
    """Values shared by every token (a bias table, the offset biases: (1,
    H, 1, nb)) get their float32 gradient summed per program's block of
    viewers, ``ceil(L / block)`` rows, never one per token (B, H, L, nb);
    per-token values keep a row per token. The sizes of the buffers the
    backward's launches allocate, and the gradient they give against the
    per-token run of the same values expanded."""
    g = torch.Generator().manual_seed(5)
    grid, skip = (9, 8), 1
    n = skip + grid[0] * grid[1]
    base = _term(grid, 'product', skip, 'k', g, shared=True)
    table = base.values.detach()
    q, k, v = (torch.randn(2, 3, n, 16, generator=g) for _ in range(3))
    grads = []
    for values in (table, table.expand(2, 3, n, -1).clone()):
        terms = [base._replace(on=on, values=values.requires_grad_(True))
                 for on in 'kq']
        launches, outs = triton_launch.backward_launches(
            *triton_launch_args(q, k, v, terms))
        for launch in launches:
            launch()
        grads.append(outs[3:])
        blocks = {launch.name: launch.meta for launch in launches}
        if values.shape[0] == 1:  # shared: a row per block
            assert outs[3].shape[2] == -(-n // blocks['backward_q']['BM'])
            assert outs[4].shape[2] == -(-n // blocks['backward_kv']['BN'])
        else:
            assert outs[3].shape[2] == outs[4].shape[2] == n
    for shared, per_token in zip(*grads):
        torch.testing.assert_close(shared.sum((0, 2)), per_token.sum((0, 2)),
                                   **SUMS_TOL)


def triton_launch_args(q, k, v, terms):
    """The arguments of ``backward_launches`` for a forward of ``terms``
    (no dropout, no mask) with a random output gradient."""
    from mmpe.models.layers.attention.fused_triton import (backward_delta,
                                                           triton_op_inputs)
    args, _ = triton_op_inputs(q, k, v, None, terms)
    (q, k, v, mask, values_k, values_q, with_sums, nb, rows, cols, layout,
     dropout_p, _) = args
    launch, out, lse, _ = triton_launch.forward_launch(
        q, k, v, mask, values_k, values_q, with_sums, nb, rows, cols, layout,
        0, dropout_p, interpreted())
    launch()
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
    delta = backward_delta(grad, out, None, None)
    return (grad, None, q, k, v, delta, lse, mask, values_k, values_q, rows,
            cols, layout, 0, dropout_p, interpreted())
