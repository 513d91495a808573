"""The rule of attn_impl='auto' as a pure function: the CPU rule (length
threshold), the CUDA rule (memory estimates against the free memory) with
CUDA-like inputs, and what the backends keep for the backward, counted on
CPU with autograd's saved-tensor hooks."""
import dataclasses

import pytest
import torch

from mmpe.models.layers import PEAttention
from mmpe.models.layers.attention.backend_rule import (AUTO_CHUNKED_FROM,
                                                       CUDA_MEMORY_FRACTION,
                                                       AttentionCall,
                                                       auto_backend,
                                                       cuda_free_bytes,
                                                       memory_estimate)
from mmpe.models.layers.attention.chunked import CHUNK_ELEMENTS

GiB = 2**30
# DETR-R50's encoder on a batch of the 150-epoch recipe: 2 images, 8 heads
# of 32 channels, a 34 x 34 C5 grid (two 800 x 1067 images, one portrait)
DETR = dict(batch=2, heads=8, head_dim=32, length=34 * 34)
# ViT-B global attention on 1024 x 1024 images (16-pixel patches)
VITB = dict(batch=2, heads=12, head_dim=64, length=64 * 64)


def _cuda(needs_grad=True, **kw):
    return AttentionCall(needs_grad=needs_grad, device_type='cuda', **kw)


@pytest.mark.parametrize('free', [None, 1, 80 * GiB])
def test_cpu_rule_is_the_length_threshold(free):
    """Off CUDA the free memory is ignored: the documented CPU rule."""
    short, long = AUTO_CHUNKED_FROM - 1, AUTO_CHUNKED_FROM
    cases = [
        (AttentionCall(short, True), False, 'explicit'),
        (AttentionCall(long, True), False, 'chunked'),
        (AttentionCall(long, True), True, 'chunked'),  # never trains flex
        (AttentionCall(8192, False), False, 'sdpa'),
        (AttentionCall(long, False, values_term=True), True, 'chunked'),
        (AttentionCall(short, False, values_term=True), False, 'explicit'),
    ]
    for call, flex_ok, want in cases:
        assert auto_backend(call, flex_ok, free_bytes=free) == want, call
        assert auto_backend(call, flex_ok, True, free) == 'fused'


def test_cuda_rule_detr_recipe_keeps_explicit_on_a_large_gpu():
    # 3 (B, H, L, L) float32 buffers: 3 * 2 * 8 * 1156^2 * 4 bytes = 257 MB,
    # a quarter of 1.03 GB
    call = _cuda(**DETR)
    assert memory_estimate('explicit', call) == 3 * 16 * 1156**2 * 4
    assert auto_backend(call, True, free_bytes=60 * GiB) == 'explicit'
    # short of memory: training never takes FlexAttention (see the rule)
    assert auto_backend(call, True, free_bytes=GiB // 2) == 'chunked'
    assert auto_backend(call, False, free_bytes=GiB // 2) == 'chunked'
    # the boundary: the estimate against the share of free memory
    edge = int(memory_estimate('explicit', call) / CUDA_MEMORY_FRACTION) + 1
    assert auto_backend(call, True, free_bytes=edge) == 'explicit'
    assert auto_backend(call, True, free_bytes=edge - 8) == 'chunked'


def test_cross_attention_counts_queries_times_keys():
    """A DETR decoder's cross-attention (BoxRPB): 300 queries against a
    34 x 34 grid; the square tensors are (B, H, Q, S), not (B, H, Q, Q),
    and the CPU threshold is on the size of that tensor (a self-attention
    of AUTO_CHUNKED_FROM tokens)."""
    cross = _cuda(**dict(DETR, length=300, keys=34 * 34))
    assert cross.key_count == 34 * 34
    assert memory_estimate('explicit', cross) == 3 * 16 * 300 * 1156 * 4
    assert memory_estimate('sdpa', cross) == 2 * 16 * 300 * 1156 * 4
    assert AttentionCall(300, True).key_count == 300  # self-attention
    few = AttentionCall(10, True, keys=AUTO_CHUNKED_FROM * 50)
    many = AttentionCall(AUTO_CHUNKED_FROM, True, keys=AUTO_CHUNKED_FROM)
    assert auto_backend(few) == 'explicit'  # 10 x 51200 < 1024^2
    assert auto_backend(many) == 'chunked'


def test_cuda_rule_vit_b_global_attention_by_gpu_size():
    # 3 * 2 * 12 * 4096^2 * 4 bytes = 4.5 GiB at the backward's peak
    call = _cuda(**VITB)
    assert memory_estimate('explicit', call) == 3 * 24 * 4096**2 * 4
    assert auto_backend(call, True, free_bytes=70 * GiB) == 'explicit'
    assert auto_backend(call, True, free_bytes=12 * GiB) == 'chunked'
    half = _cuda(**dict(VITB, itemsize=2))  # bf16 / fp16: half the bytes
    assert auto_backend(half, True, free_bytes=12 * GiB) == 'explicit'


def test_cuda_rule_inference_and_values_terms():
    # inference: the dense (B, H, L, L) bias of SDPA (1.5 GiB), two while
    # a second term is added
    call = _cuda(needs_grad=False, **VITB)
    assert memory_estimate('sdpa', call) == 24 * 4096**2 * 4
    two = _cuda(needs_grad=False, logit_terms=2, **VITB)
    assert memory_estimate('sdpa', two) == 2 * 24 * 4096**2 * 4
    assert auto_backend(call, True, free_bytes=8 * GiB) == 'sdpa'
    assert auto_backend(two, True, free_bytes=8 * GiB) == 'flex'
    assert auto_backend(call, True, free_bytes=4 * GiB) == 'flex'
    # iRPE on values needs the probabilities: never flex
    vals = _cuda(values_term=True, **VITB)
    assert auto_backend(vals, True, free_bytes=GiB) == 'chunked'
    # while tracing the free memory is unknown: the length threshold
    assert auto_backend(_cuda(**VITB), True) == 'chunked'
    assert auto_backend(_cuda(**DETR), True) == 'chunked'
    assert auto_backend(_cuda(needs_grad=False, values_term=True, **VITB),
                        True) == 'chunked'
    assert auto_backend(_cuda(**dict(DETR, length=30 * 30)), True) == \
        'explicit'


def test_estimates_without_square_tensors_stay_linear():
    """chunked: two (B, H, R, L) blocks of at most CHUNK_ELEMENTS; flex:
    (B, H, Lp, d) tensors of the power-of-two bucket Lp."""
    call = _cuda(**VITB)
    assert memory_estimate('chunked', call) <= 2 * CHUNK_ELEMENTS * 4
    # 8 * (2 * 12 * 4096 * 64) * 4 + (2 * 12 * 4096) * 4 + 2 * 4096
    assert memory_estimate('flex', call) == (8 * 24 * 4096 * 64 * 4 +
                                             24 * 4096 * 4 + 2 * 4096)
    odd = _cuda(**dict(VITB, length=4097))  # the next bucket: 8192
    assert memory_estimate('flex', odd) == (8 * 24 * 8192 * 64 * 4 +
                                            24 * 8192 * 4 + 2 * 8192)
    with pytest.raises(ValueError, match=r"'fast'.*'explicit'"):
        memory_estimate('fast', call)


def test_cuda_free_bytes_is_none_off_cuda():
    assert cuda_free_bytes(torch.device('cpu')) is None


def _saved_square_tensors(core, impl, grid):
    """Distinct (B, H, L, L) tensors autograd keeps for the backward of one
    training call."""
    torch.manual_seed(0)
    n = grid[0] * grid[1]
    q, k, v = (torch.randn(2, 2, n, 8, requires_grad=True) for _ in range(3))
    saved = {}

    def pack(t):
        if t.dim() == 4 and t.shape[-2:] == (n, n):
            saved[t.untyped_storage().data_ptr()] = tuple(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = core.attend(q, k, v, grid)
    out.sum().backward()
    return list(saved.values())


@pytest.mark.parametrize('impl,count', [('explicit', 1), ('chunked', 0)])
def test_what_backends_keep_for_the_backward(impl, count):
    """The estimate's premise, measured on CPU: the explicit backend keeps
    one (B, H, L, L) tensor (the probabilities) for the backward, the
    chunked one none."""
    core = PEAttention(16, 2, attn_impl=impl,
                       rpe_cfg=dict(ratio=1.0, init='xavier'))
    assert len(_saved_square_tensors(core, impl, (5, 6))) == count


@pytest.mark.parametrize('length', [1050, 4200])
def test_shared_terms_take_the_fused_kernel_where_measured(length):
    """Terms shared by every query (the offset biases, iRPE's bias mode):
    the fused kernel on CPU (measured no slower, no heavier than explicit:
    docs/data/attention_broadcast_terms.json), the dense backend's memory
    rule on CUDA (not measured); other terms keep the kernel on both."""
    sizes = dict(DETR, length=length)
    for grad in (True, False):
        cpu = AttentionCall(needs_grad=grad, shared_terms=True, **sizes)
        assert auto_backend(cpu, False, True) == 'fused'
        cuda = _cuda(grad, shared_terms=True, **sizes)
        assert auto_backend(cuda, False, True, 80 * GiB) == (
            'explicit' if grad else 'sdpa')
        assert auto_backend(cuda, False, True, GiB // 8) == 'chunked'
        other = dataclasses.replace(cuda, shared_terms=False)
        assert auto_backend(other, False, True, GiB // 8) == 'fused'


@pytest.mark.parametrize('cfg,shared', [
    (dict(bias_cfg=dict(type='alibi-2d')), True),
    (dict(bias_cfg=dict(type='log-cpb', pretrained_size=(3, 4))), True),
    (dict(rpe_cfg=dict(mode='bias', method='product')), True),
    (dict(rpe_cfg=dict(mode='bias', method='cross'), rpe_on='q'), True),
    (dict(rpe_cfg=dict(mode='contextual', method='product')), False),
    (dict(rel_pos_cfg=dict(input_size=(3, 4))), False),
])
def test_calls_say_whether_a_term_is_shared(cfg, shared):
    """``AttentionCall.of`` reads ``axis_shared`` of the call's terms."""
    core = PEAttention(16, 4, **cfg)
    q = torch.zeros(2, 4, 12, 4)
    call = AttentionCall.of(q, True, core.relative_terms(q, q, 3, 4), False)
    assert call.shared_terms is shared
