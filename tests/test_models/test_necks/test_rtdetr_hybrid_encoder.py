"""RTDETRHybridEncoder: the released HybridEncoder's outputs (fixtures of
lyuwenyu/RT-DETR, R18vd and R50vd settings, 640 x 640 and 480 x 800), every
AIFI encoding at many sizes and in padded batches, RepVGG's deploy fusion,
gradients, errors.

Expected values: the released modules' recorded outputs
(``tests/data/rtdetr_authors``, see ``tests/rtdetr_parity.py``), the
released sin-cos written here as a per-token loop, and, for padding, the
same image alone (a padded image's AIFI tokens against the unpadded
image's; an image of a padded batch against itself padded alone).
"""
import math
import warnings

import pytest
import torch
import torch.nn as nn
from rtdetr_parity import (PARITY_RTOL, build_neck, fixture, level_errors,
                           released_features)

from mmpe.models.layers.attention.fused import fused_unavailable_reason
from mmpe.models.necks import CSPRepLayer, RepVGGBlock, RTDETRHybridEncoder
from mmpe.models.necks.rtdetr_hybrid_encoder import aifi_sincos
from mmpe.models.utils.padding_mask import padding_mask_from_shapes

#: float32 sums of one image alone and inside a batch (other matmul blocks)
BATCH_TOL = dict(atol=1e-5, rtol=1e-5)
#: float32: a fused 3x3 conv against two convs and two BNs
FUSE_TOL = dict(atol=1e-5, rtol=1e-4)

PARITY = [('r18', '640x640'), ('r18', '480x800'), ('r50', '640x640'),
          ('r50', '480x800')]

#: every AIFI encoding (the relative ones on top of the sine or alone)
ENCODINGS = {
    'sine': dict(absolute='sine'),
    'none': dict(absolute='none'),
    'irpe-bias': dict(relative=dict(type='irpe', mode='bias', ratio=1.9,
                                    init='xavier', on='k')),
    'irpe-ctx': dict(absolute='none', relative=dict(
        type='irpe', mode='contextual', method='product', ratio=1.9,
        init='xavier', on='qkv')),
    'rope2d': dict(absolute='none', relative='rope2d'),
    'rope-mixed': dict(relative='rope-mixed'),
    'rope-mixed-norm': dict(absolute='none', relative=dict(
        type='rope-mixed', coords='normalized')),
    'log-cpb': dict(relative=dict(type='log-cpb', pretrained_size=(4, 4),
                                  hidden=16)),
    'alibi-2d': dict(relative='alibi-2d'),
    'lookhere': dict(absolute='none', relative=dict(
        type='lookhere', directions='corners')),
}


def _layout(size_name):
    # the released sin-cos shuffles non-square grids (module docstring)
    h, w = size_name.split('x')
    return 'grid' if h == w else 'released'


def _neck_errors(name, size_name, neck):
    data = fixture(name)
    with torch.no_grad():
        outs = neck(released_features(name, size_name))
    return level_errors(outs, data['sizes'][size_name]['encoder'],
                        data['seed'])


@pytest.mark.parametrize('name,size_name', PARITY)
def test_backbone_and_neck_equal_the_released_modules(name, size_name):
    data = fixture(name)
    feats = released_features(name, size_name)
    assert max(level_errors(feats, data['sizes'][size_name]['backbone'],
                            data['seed'])) < PARITY_RTOL
    neck = build_neck(name, sine_layout=_layout(size_name))
    assert max(_neck_errors(name, size_name, neck)) < PARITY_RTOL
    if (name, size_name) != ('r50', '480x800'):
        return
    # RepVGG's deploy fusion: the same outputs with one conv per block
    neck.switch_to_deploy()
    assert not any(hasattr(m, 'conv1') for m in neck.modules()
                   if isinstance(m, RepVGGBlock))
    assert max(_neck_errors(name, size_name, neck)) < PARITY_RTOL


def test_parity_controls_differ():
    # a permuted FFN weight of AIFI
    neck = build_neck('r18', sine_layout='released')
    weight = neck.encoder[0].layers[0].ffn.layers[1].weight
    with torch.no_grad():
        weight.copy_(weight[[1, 0, *range(2, weight.shape[0])]])
    assert min(_neck_errors('r18', '480x800', neck)) > 100 * PARITY_RTOL
    # the grid layout of the sin-cos is not the released shuffle on a
    # non-square grid (on a square one it is: the 640 x 640 case above)
    neck = build_neck('r18', sine_layout='grid')
    assert max(_neck_errors('r18', '480x800', neck)) > 100 * PARITY_RTOL


def _sincos_1d(p, quarter, temperature):
    omega = [1. / temperature**(i / quarter) for i in range(quarter)]
    return [math.sin(p * o) for o in omega] + [math.cos(p * o) for o in omega]


def _released_sincos_loop(h, w, dims, temperature):
    """The released table, token by token: the token at row-major index k
    of an (h, w) map gets the meshgrid indices (k // h, k % h)."""
    rows = []
    for k in range(h * w):
        a, b = divmod(k, h)
        rows.append(_sincos_1d(a, dims // 4, temperature) +
                    _sincos_1d(b, dims // 4, temperature))
    return torch.tensor(rows)


@pytest.mark.parametrize('hw', [(5, 5), (3, 7), (6, 4)])
def test_sincos_layouts(hw):
    h, w = hw
    ref = _released_sincos_loop(h, w, 16, 10000.)
    released = aifi_sincos(hw, 16, 10000., 'released')[0]
    torch.testing.assert_close(released, ref, atol=1e-5, rtol=0)
    # 'grid': (a, b) = (y, x) on every grid, the released table on squares
    grid = aifi_sincos(hw, 16, 10000., 'grid')[0]
    for y in range(h):
        for x in range(w):
            expected = torch.tensor(_sincos_1d(y, 4, 10000.) +
                                    _sincos_1d(x, 4, 10000.))
            torch.testing.assert_close(grid[y * w + x], expected, atol=1e-5,
                                       rtol=0)
    assert torch.allclose(grid, released, atol=1e-5) == (h == w)
    # per image: the released layout of each image's valid grid
    extent = torch.tensor([[h, w], [2, 3]])
    per_image = aifi_sincos(hw, 16, 10000., 'released', extent)
    torch.testing.assert_close(per_image[0], released)
    small = _released_sincos_loop(2, 3, 16, 10000.).view(2, 3, 16)
    torch.testing.assert_close(
        per_image[1].view(h, w, 16)[:2, :3], small, atol=1e-5, rtol=0)


def _small_neck(encoder_pe, levels=3, **kwargs):
    torch.manual_seed(0)
    cfg = dict(in_channels=[8, 16, 32][-levels:],
               feat_strides=[8, 16, 32][-levels:], hidden_dim=32,
               use_encoder_idx=[levels - 1], num_heads=4, dim_feedforward=64,
               expansion=0.5, depth_mult=0.34, encoder_pe=encoder_pe)
    neck = RTDETRHybridEncoder(**{**cfg, **kwargs})
    neck.init_weights()
    return neck.eval()


class _Patchify(nn.Module):
    """A per-image backbone stand-in: one strided conv per level."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.convs = nn.ModuleList(
            nn.Conv2d(3, c, s, stride=s) for c, s in ((8, 8), (16, 16),
                                                      (32, 32)))

    def forward(self, x):
        return tuple(conv(x) for conv in self.convs)


#: every encoding, and the released layout of those with the sin-cos
PADDED_CASES = [(name, 'grid') for name in ENCODINGS] + [
    (name, 'released') for name, pe in ENCODINGS.items()
    if pe.get('absolute', 'sine') == 'sine'
]


@pytest.mark.parametrize('encoding,layout', PADDED_CASES)
def test_padded_image_equals_itself_alone(encoding, layout):
    neck = _small_neck(ENCODINGS[encoding], sine_layout=layout)
    torch.manual_seed(2)
    shapes = [(96, 160), (128, 64), (64, 96)]
    images = torch.zeros(3, 3, 128, 160)
    for i, (h, w) in enumerate(shapes):
        images[i, :, :h, :w] = torch.rand(3, h, w)
    mask = padding_mask_from_shapes(shapes, (128, 160))
    backbone = _Patchify()
    with torch.no_grad():
        feats = backbone(images)
        batch = neck(feats, mask)
        for i, (h, w) in enumerate(shapes):
            alone = neck(backbone(images[i:i + 1]), mask[i:i + 1])
            for level_b, level_a in zip(batch, alone):
                torch.testing.assert_close(level_b[i:i + 1], level_a,
                                           **BATCH_TOL)
            # AIFI: the padded image's tokens equal the unpadded image's
            # (padded keys masked; positions of its own valid grid)
            feat = neck.input_proj[2](feats[2][i:i + 1])
            padded = neck.aifi(0, feat, mask[i:i + 1])
            cut = neck.aifi(0, feat[..., :h // 32, :w // 32].contiguous())
            torch.testing.assert_close(padded[..., :h // 32, :w // 32], cut,
                                       **BATCH_TOL)
            # ... whatever the padded tokens hold
            noisy = feat.clone()
            noisy[..., h // 32:, :] = 5 * torch.randn_like(
                noisy[..., h // 32:, :])
            noisy[..., :, w // 32:] = 5 * torch.randn_like(
                noisy[..., :, w // 32:])
            torch.testing.assert_close(
                neck.aifi(0, noisy, mask[i:i + 1])[..., :h // 32, :w // 32],
                cut, **BATCH_TOL)


#: network input sizes (H, W): the released 640, mmdet's 1333 x 800 padded
#: to 32, a keep-ratio 864 x 480, and 1280 x 1280 (AIFI's stride-32 level
#: only: the fusion's convs do not depend on the encoding)
SIZES = [(640, 640), (800, 1344), (480, 864), (1280, 1280)]


@pytest.mark.parametrize('encoding', list(ENCODINGS))
def test_every_encoding_at_every_size(encoding):
    neck = _small_neck(ENCODINGS[encoding], levels=1)
    torch.manual_seed(3)
    for height, width in SIZES:
        feat = torch.randn(2, 32, height // 32, width // 32)
        with torch.no_grad():
            out, = neck((feat, ))
        assert out.shape == (2, 32, height // 32, width // 32)
        assert torch.isfinite(out).all()


@pytest.mark.parametrize('encoding', list(ENCODINGS))
def test_gradients_reach_every_parameter(encoding):
    neck = _small_neck(ENCODINGS[encoding]).train()
    torch.manual_seed(4)
    # an odd side: the upsampled level is cut to the lower one's size
    feats = [torch.randn(2, c, h, w) for c, h, w in ((8, 12, 10), (16, 6, 5),
                                                     (32, 3, 3))]
    outs = neck(feats)
    sum((o * torch.randn_like(o)).sum() for o in outs).backward()
    for name, param in neck.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


#: the encodings with relative terms (the fused kernels' contract)
TERMS = ('irpe-bias', 'irpe-ctx', 'log-cpb', 'alibi-2d', 'lookhere')
#: float32: the same softmax attention summed in other orders (fused
#: kernel blocks, chunks) than the explicit backend's
BACKEND_TOL = dict(atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize('impl', ['fused', 'chunked'])
@pytest.mark.parametrize('encoding', TERMS)
def test_aifi_runs_on_every_backend(encoding, impl):
    if impl == 'fused' and fused_unavailable_reason() is not None:
        pytest.skip(fused_unavailable_reason())
    torch.manual_seed(6)
    shapes = [(96, 160), (64, 96)]
    mask = padding_mask_from_shapes(shapes, (96, 160))
    feats = [torch.randn(2, c, 96 // s, 160 // s)
             for c, s in ((8, 8), (16, 16), (32, 32))]
    results = []
    for attn_impl in ('explicit', impl):
        # eval mode (with gradients): a train-mode BN after another makes
        # the first's bias gradient analytically 0, i.e. rounding noise
        neck = _small_neck(ENCODINGS[encoding], attn_impl=attn_impl)
        with warnings.catch_warnings():
            warnings.simplefilter('error')  # no fallback
            outs = neck(feats, mask)
        sum((o * o).sum() for o in outs).backward()
        results.append((outs, {n: p.grad for n, p in
                               neck.named_parameters()}))
    (ref, ref_grads), (outs, grads) = results
    for level, ref_level in zip(outs, ref):
        torch.testing.assert_close(level, ref_level, **BACKEND_TOL)
    for name, grad in grads.items():
        torch.testing.assert_close(
            grad, ref_grads[name], **BACKEND_TOL,
            msg=lambda m, name=name: f'{name}: {m}')


def test_repvgg_deploy_fusion():
    torch.manual_seed(5)
    block = RepVGGBlock(6, 10, act_cfg=dict(type='SiLU'))
    for bn in (block.conv1.bn, block.conv2.bn):  # non-trivial statistics
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        nn.init.uniform_(bn.weight, 0.5, 1.5)
        nn.init.uniform_(bn.bias, -0.5, 0.5)
    block.eval()
    x = torch.randn(2, 6, 7, 9)
    with torch.no_grad():
        ref = block(x)
        block.switch_to_deploy()
        fused = block(x)
        block.switch_to_deploy()  # again: nothing to do
    assert set(dict(block.named_children())) == {'conv', 'act'}
    torch.testing.assert_close(fused, ref, **FUSE_TOL)
    # control: a BN statistic left out of the fusion shows
    block.conv.bias.data += 0.1
    assert not torch.allclose(block(x), ref, **FUSE_TOL)


def test_csp_rep_layer_widths():
    layer = CSPRepLayer(16, 8, num_blocks=2, expansion=0.5)
    assert len(layer.bottlenecks) == 2 and layer.conv1.conv.out_channels == 4
    assert layer(torch.randn(1, 16, 5, 5)).shape == (1, 8, 5, 5)
    assert isinstance(CSPRepLayer(16, 8).conv3, nn.Identity)


@pytest.mark.parametrize('kwargs,match', [
    (dict(encoder_pe=dict(absolute='learnable')), "'learnable'.*AIFI"),
    (dict(encoder_pe=dict(decoder_pos='sine')), 'decoder_pos'),
    (dict(encoder_pe=dict(relative='alibi')), 'alibi-2d'),
    (dict(encoder_pe=dict(relative='rope2d'), num_heads=16),
     'multiple of 4'),
    (dict(sine_layout='xy'), 'sine_layout'),
    (dict(use_encoder_idx=[3]), 'use_encoder_idx'),
    (dict(act='mish'), '`act`'),
    (dict(hidden_dim=30, num_heads=3), 'multiple of 4'),
])
def test_errors_name_the_value_and_the_choices(kwargs, match):
    kwargs = dict(kwargs)
    with pytest.raises(ValueError, match=match):
        _small_neck(kwargs.pop('encoder_pe', None), **kwargs)


def test_no_encoder_layer():
    # num_encoder_layers=0: the fusion alone (no AIFI parameters)
    neck = _small_neck(None, num_encoder_layers=0)
    assert not any(n.startswith('encoder.') for n, _ in
                   neck.named_parameters())
    outs = neck([torch.randn(1, c, s, s) for c, s in ((8, 8), (16, 4),
                                                      (32, 2))])
    assert [o.shape[-1] for o in outs] == [8, 4, 2]


def test_wrong_number_of_levels():
    neck = _small_neck(None)
    with pytest.raises(ValueError, match='2 input levels'):
        neck([torch.randn(1, 8, 4, 4), torch.randn(1, 16, 2, 2)])


def test_parser_keeps_its_former_import_paths():
    from mmpe.models.detectors import encoder_pe as former
    from mmpe.models.detectors import pe_encoders as former_encoders
    from mmpe.models.layers.blocks import pe_encoders
    from mmpe.models.utils import encoder_pe
    assert former.parse_encoder_pe is encoder_pe.parse_encoder_pe
    assert former_encoders.PEDetrTransformerEncoder is \
        pe_encoders.PEDetrTransformerEncoder
