"""What the fused Triton kernel keeps for its backward and where its
offsets stop: the bytes a call saves (``saved_tensors_hooks``) against
``F.scaled_dot_product_attention`` without a term, the refusal of per-head
offsets past 2^31, and the dropout's counters (the pair's two token
indices, not their product). Run in Triton's interpreter where no GPU is
(the conftest sets ``TRITON_INTERPRET=1``).
"""
import pytest
import torch
import torch.nn.functional as F

from mmpe.models.layers import PEAttention
from mmpe.models.layers.attention.backends import choice
from mmpe.models.layers.attention.fused_triton import (dropout_mask,
                                                       interpreted)
from mmpe.models.layers.attention.triton_launch import (INT32_LIMIT,
                                                        check_offsets)

pytestmark = pytest.mark.skipif(
    not (interpreted() or torch.cuda.is_available()),
    reason='Triton kernels need CUDA or TRITON_INTERPRET=1')

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
#: the aim: one term on keys, bfloat16, at most this times SDPA's bytes
SAVED_RATIO = 1.3


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
