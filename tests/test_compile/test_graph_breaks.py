"""Every position encoding of mmpe compiles in one graph with a symbolic
grid: ``torch.compile(fullgraph=True, dynamic=True)`` (a graph break is an
error there) over five grid sizes compiles exactly once (no recompile).

Covered here, inference (the training path of the attention core, with its
backward, is in ``test_attention_compile.py``):

- the DETR-family encoders (DETR, Conditional DETR, DAB-DETR, each from its
  quick-start config with one encoder layer) with the ``encoder_pe``
  absolute part (sine / learnable / none) and relative part (none, iRPE in
  several modes / methods / ``on``, RoPE-2D, RoPE-Mixed, with integer or
  normalised coordinates, the offset biases log-CPB, 2D ALiBi, LookHere;
  and in training, with the coordinates' augmentations drawn inside the
  graph);
- the CPVT backbone with every ``pos_encoding`` and the DeiT-iRPE layout
  (class token, learnable table and iRPE), with a padding mask; and with
  ViTDet's windows (the padding to whole windows symbolic too).

The backend only counts graphs, so these tests measure tracing, not code
generation; the outputs must equal eager.
"""
import pytest
import torch

from compile_cases import GRIDS, EncoderCall, feature_batch, small_detector
from mmpe.models.backbones import CPVT

# the traced graph runs the eager kernels: equal up to op reordering
TOL = dict(atol=1e-5, rtol=1e-5)
IRPE = dict(type='irpe', mode='contextual', method='product', on='k')
RELATIVES = {
    'none': None,
    'irpe-ctx-product-k': IRPE,
    'irpe-bias-cross-qk': dict(IRPE, mode='bias', method='cross', on='qk'),
    'irpe-ctx-euclidean-qkv-clip': dict(
        IRPE, method='euclidean', on='qkv', index='clip', max_distance=3),
    'irpe-ctx-quant-v-perhead': dict(
        IRPE, method='quant', on='v', shared_head=False),
    'rope2d': 'rope2d',
    'rope-mixed': 'rope-mixed',
    # DINOv3's normalised coordinates, from each image's valid extent in
    # the mask (rescale acts in training only)
    'rope2d-norm-max': dict(type='rope2d', coords='normalized',
                            normalize='max'),
    'rope-mixed-norm': dict(type='rope-mixed', coords='normalized',
                            rescale=2.),
    # the offset biases: their tables made from the symbolic grid
    'log-cpb': dict(type='log-cpb', pretrained_size=(8, 8)),
    'alibi-2d': 'alibi-2d',
    'lookhere': dict(type='lookhere', directions='triangles'),
}
# DETR: every relative part with sine, and three of them with the other
# absolute parts; Conditional / DAB-DETR (same attention class, own encoder
# and absolute-part wiring): the main relative parts and absolute parts.
ENCODER_CASES = (
    [('DETR', 'sine', rel) for rel in RELATIVES] +
    [('DETR', absolute, rel) for absolute in ('learnable', 'none')
     for rel in ('none', 'irpe-ctx-product-k', 'rope-mixed')] +
    [(det, 'sine', rel) for det in ('ConditionalDETR', 'DABDETR')
     for rel in ('none', 'irpe-ctx-product-k', 'rope2d', 'rope-mixed',
                 'rope-mixed-norm')] +
    [(det, absolute, 'irpe-ctx-product-k')
     for det in ('ConditionalDETR', 'DABDETR')
     for absolute in ('learnable', 'none')] +
    [('ConditionalDETR', 'sine', 'log-cpb'), ('DABDETR', 'none', 'lookhere')])


def _compile_once(fn, inputs):
    """Outputs of ``fn`` compiled (fullgraph, dynamic) on every input tuple
    and the number of graphs compiled for them."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(fn, backend='eager', fullgraph=True,
                             dynamic=True)
    outs = [compiled(*args) for args in inputs]
    return torch._dynamo.utils.counters['stats']['unique_graphs'], outs


@pytest.mark.parametrize('detector,absolute,relative', ENCODER_CASES)
def test_encoder_one_graph_no_recompile(detector, absolute, relative):
    pe = dict(absolute=absolute)
    if RELATIVES[relative] is not None:
        pe['relative'] = RELATIVES[relative]
    call = EncoderCall(small_detector(detector, pe))
    inputs = [feature_batch(g, call.detector.embed_dims) for g in GRIDS]
    with torch.no_grad():
        graphs, outs = _compile_once(call, inputs)
        assert graphs == 1
        for args, out in zip(inputs, outs):
            torch.testing.assert_close(out, call(*args), **TOL)


def test_encoder_with_augmented_coordinates_one_graph_in_training():
    """Training mode: DINOv3's coordinate augmentations draw from torch's
    generator inside the graph; the same seed gives eager's outputs."""
    pe = dict(absolute='sine', relative=dict(
        type='rope-mixed', coords='normalized', normalize='min', shift=0.1,
        jitter=1.2, rescale=2.))
    call = EncoderCall(small_detector('DETR', pe)).train()
    inputs = [feature_batch(g, call.detector.embed_dims) for g in GRIDS]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(call, backend='eager', fullgraph=True,
                             dynamic=True)
    with torch.no_grad():
        for seed, args in enumerate(inputs):
            torch.manual_seed(seed)
            got = compiled(*args)
            torch.manual_seed(seed)
            torch.testing.assert_close(got, call(*args), **TOL)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1


BACKBONES = {
    'peg': dict(pos_encoding='peg'),
    'none': dict(pos_encoding='none'),
    'learnable': dict(pos_encoding='learnable'),
    'sine+peg': dict(pos_encoding=('sine', 'peg')),
    'rope2d': dict(pos_encoding='rope2d'),
    'rope-mixed': dict(pos_encoding='rope-mixed'),
    'irpe': dict(pos_encoding='irpe'),
    'deit-irpe': dict(pos_encoding=('learnable', 'irpe'), use_cls_token=True),
    # tables made for (6, 6): resized to each grid inside the graph
    'rel-pos': dict(pos_encoding='rel-pos', rel_pos_cfg=dict(input_size=6)),
    'log-cpb': dict(pos_encoding='log-cpb', bias_cfg=dict(hidden=16)),
    'alibi-2d': dict(pos_encoding='alibi-2d'),
    'lookhere': dict(pos_encoding='lookhere'),
    # a class token: zero bias for its pairs
    'cls-lookhere': dict(pos_encoding='lookhere', use_cls_token=True),
    # DINOv2 with registers: the table resampled per image (weight matrices
    # of each image's extent); EVA-02 (below, windowed): scaled positions,
    # the window blocks' own, SwiGLU with sub-LN
    'dinov2-reg': dict(pos_encoding='learnable', pos_embed_interp='dinov2-reg',
                       use_cls_token=True, num_register_tokens=2,
                       block_cfg=dict(layer_scale_init=1.)),
    'eva02': dict(pos_encoding=('learnable', 'rope2d'),
                  rope_cfg=dict(theta=1e4, scale=(0.5, 0.25),
                                window_scale=2.),
                  block_cfg=dict(mlp_type='swiglu-subln')),
}
# ViTDet's layout: 3 x 3 windows in block 0 (no grid of GRIDS is whole
# windows in both sides), block 1 global
WINDOWS = dict(window_size=3, global_blocks=(1, ))
BACKBONES.update({
    f'{name}-windows': dict(BACKBONES[name], **WINDOWS)
    for name in ('peg', 'none', 'learnable', 'sine+peg', 'rope2d',
                 'rope-mixed', 'irpe', 'rel-pos', 'log-cpb', 'alibi-2d',
                 'lookhere', 'eva02')
})
del BACKBONES['eva02']  # windows: its window positions are the point


@pytest.mark.parametrize('name', BACKBONES)
def test_cpvt_one_graph_no_recompile(name):
    torch.manual_seed(0)
    backbone = CPVT(
        arch=dict(embed_dims=32, depth=2, num_heads=4, mlp_ratio=2.),
        img_size=64, patch_size=8, out_indices=(0, 1),
        **BACKBONES[name]).eval()
    inputs = []
    for i, (h, w) in enumerate(GRIDS):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(2, 3, 8 * h, 8 * w, generator=g)
        pad = torch.zeros(2, 8 * h, 8 * w, dtype=torch.bool)
        pad[1, -8:] = True  # the second image's last token row is padding
        inputs.append((x, pad))
    with torch.no_grad():
        graphs, outs = _compile_once(backbone, inputs)
        assert graphs == 1
        for (x, pad), out in zip(inputs, outs):
            for o, want in zip(out, backbone(x, pad)):
                torch.testing.assert_close(o, want, **TOL)


@pytest.mark.parametrize('name', ['irpe-windows', 'rope-mixed-windows',
                                  'rel-pos-windows', 'log-cpb-windows',
                                  'lookhere-windows'])
def test_windowed_cpvt_training_one_graph(name):
    """Forward and backward (AOTAutograd traces the backward) of a windowed
    backbone with a padded batch: one graph over the grids, the gradients
    of eager."""
    torch.manual_seed(0)
    backbone = CPVT(
        arch=dict(embed_dims=32, depth=2, num_heads=4, mlp_ratio=2.),
        img_size=64, patch_size=8, out_indices=(1, ),
        **BACKBONES[name]).train()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(backbone, backend='aot_eager', fullgraph=True,
                             dynamic=True)
    # (6, 7) then (8, 11): whole windows in height, then in neither side
    for i, (h, w) in enumerate(GRIDS[0:3:2]):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(2, 3, 8 * h, 8 * w, generator=g)
        pad = torch.zeros(2, 8 * h, 8 * w, dtype=torch.bool)
        pad[1, -8:] = True
        grads = []
        for fn in (compiled, backbone):
            backbone.zero_grad()
            fn(x, pad)[0].square().mean().backward()
            grads.append({n: p.grad.clone()
                          for n, p in backbone.named_parameters()})
        for key in grads[1]:
            torch.testing.assert_close(grads[0][key], grads[1][key], **TOL,
                                       msg=key)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
