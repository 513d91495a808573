"""ViTSimpleFPN: strides, channels, extra levels, gradients and errors.

Expected values of every level come from a reference written here with
torch's functional ops (transposed convs, convs, a LayerNorm over the
channels written out, GELU from its erf form, max-pooling of a map padded
with -inf) from ViTDet's pyramid (Li et al., ECCV 2022, Sec. 3 / Fig. 2 (c))
and RetinaNet's P6 / P7, on the neck's weights; with ``out_norm_cfg`` each
level of that reference then through a 1x1 conv and ``F.group_norm``
(detrex's DINO-ViTDet channel mapper).
"""
import math

import pytest
import torch
import torch.nn.functional as F

from mmpe.models.necks import ViTSimpleFPN

# float64: the same sums as torch's modules, perhaps in another order
_F64_TOL = dict(atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize('hw', [(8, 12), (5, 7), (1, 1)])
@pytest.mark.parametrize(
    'scale_factors,num_outs,extra_type,strides',
    [((4.0, 2.0, 1.0, 0.5), 4, 'maxpool', (4, 8, 16, 32)),
     ((4.0, 2.0, 1.0, 0.5), 5, 'maxpool', (4, 8, 16, 32, 64)),
     ((2.0, 1.0, 0.5), 5, 'conv', (8, 16, 32, 64, 128)),
     ((0.5, ), 1, 'maxpool', (32, )), ((1.0, ), 3, 'conv', (16, 32, 64))])
def test_simple_fpn_shapes(hw, scale_factors, num_outs, extra_type, strides):
    neck = ViTSimpleFPN(
        in_channels=16,
        out_channels=8,
        scale_factors=scale_factors,
        num_outs=num_outs,
        extra_type=extra_type)
    h, w = hw
    x = torch.randn(2, 16, h, w, requires_grad=True)
    outs = neck((torch.randn(2, 16, h, w), x))  # uses the last map
    assert len(outs) == num_outs
    for out, stride in zip(outs, strides):
        # stride-16 input: sizes scale by 16 / stride, rounding up
        if stride <= 16:
            size = (h * 16 // stride, w * 16 // stride)
        else:
            f = stride // 16
            size = (-(-h // f), -(-w // f))
        assert out.shape == (2, 8, *size), (stride, out.shape)
    sum(o.sum() for o in outs).backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def _layer_norm_channels(x, weight, bias, eps):
    """LayerNorm over the channels of each pixel of ``(B, C, H, W)``."""
    mean = x.mean(1, keepdim=True)
    var = ((x - mean)**2).mean(1, keepdim=True)  # biased, as LayerNorm
    y = (x - mean) / torch.sqrt(var + eps)
    return y * weight[:, None, None] + bias[:, None, None]


def _gelu(x):
    """GELU, exact: ``x Phi(x)``."""
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _max_pool_2x2_ceil(x):
    """2 x 2 / 2 max-pooling that keeps a last odd row / column (pads the
    bottom / right with -inf, then pools whole 2 x 2 cells)."""
    h, w = x.shape[-2:]
    x = F.pad(x, (0, w % 2, 0, h % 2), value=-math.inf)
    return F.max_pool2d(x, 2, stride=2)


def _conv_norm(x, conv_module, groups, padding):
    """A ConvModule: conv (biased without norm), then GroupNorm of
    ``groups`` groups or a LayerNorm over the channels if it has one."""
    conv = conv_module.conv
    x = F.conv2d(x, conv.weight, conv.bias, padding=padding)
    if groups:
        norm = conv_module.norm
        x = F.group_norm(x, groups, norm.weight, norm.bias, norm.eps)
    elif conv_module.with_norm:  # LayerNorm2d
        norm = conv_module.norm.norm
        x = _layer_norm_channels(x, norm.weight, norm.bias, norm.eps)
    return x


def fpn_reference(neck, x, groups=None):
    """Every level of ``neck`` on ``x`` (B, C, h, w), from its weights.

    Scale 4: deconv 2x2/2 (C -> C/2), LayerNorm over channels, GELU,
    deconv 2x2/2 (C/2 -> C/4); 2: deconv 2x2/2; 1: the map; 0.5: max-pool
    2x2/2 (ceil). Each then a 1x1 and a 3x3 conv (with ``groups`` groups of
    GroupNorm after each, if given, else the neck's LayerNorm2d, if any).
    Extra levels: the last level taken at
    every second pixel ('maxpool', a 1x1 max-pool with stride 2), or 3x3
    stride-2 convs with ReLU before all but the first ('conv').
    """
    outs = []
    for i, factor in enumerate(neck.scale_factors):
        stage = neck.stages[i]
        if factor == 4.0:
            up1, ln, _, up2 = stage
            y = F.conv_transpose2d(x, up1.weight, up1.bias, stride=2)
            y = _layer_norm_channels(y, ln.norm.weight, ln.norm.bias,
                                     ln.norm.eps)
            y = F.conv_transpose2d(_gelu(y), up2.weight, up2.bias, stride=2)
        elif factor == 2.0:
            y = F.conv_transpose2d(x, stage.weight, stage.bias, stride=2)
        elif factor == 1.0:
            y = x
        else:
            y = _max_pool_2x2_ceil(x)
        y = _conv_norm(y, neck.lateral_convs[i], groups, 0)
        outs.append(_conv_norm(y, neck.fpn_convs[i], groups, 1))
    for i in range(neck.num_outs - len(neck.scale_factors)):
        if neck.extra_type == 'maxpool':
            outs.append(outs[-1][..., ::2, ::2])
        else:
            conv = neck.extra_convs[i]
            last = outs[-1] if i == 0 else outs[-1].clamp(min=0)
            outs.append(
                F.conv2d(last, conv.weight, conv.bias, stride=2, padding=1))
    return outs


@pytest.mark.parametrize('hw', [(4, 6), (5, 7), (1, 1)])
@pytest.mark.parametrize(
    'scale_factors,num_outs,extra_type,norm_cfg',
    [((4.0, 2.0, 1.0, 0.5), 5, 'maxpool', None),
     ((2.0, 1.0, 0.5), 5, 'conv', None),
     ((1.0, ), 3, 'conv', None),
     ((4.0, 2.0, 1.0, 0.5), 6, 'conv', dict(type='GN', num_groups=2))],
    ids=['vitdet', 'retinanet', 'identity', 'gn'])
def test_simple_fpn_equals_functional_reference(hw, scale_factors, num_outs,
                                                extra_type, norm_cfg):
    """Every level, forward and backward (input and every weight), on
    random weights (LayerNorm and GroupNorm affines included)."""
    torch.manual_seed(0)
    neck = ViTSimpleFPN(16, 8, scale_factors=scale_factors,
                        num_outs=num_outs, extra_type=extra_type,
                        norm_cfg=norm_cfg).double()
    with torch.no_grad():
        for param in neck.parameters():
            param.normal_(0, 0.5)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, *hw, generator=g, dtype=torch.float64)
    x_ref = x.clone().requires_grad_()
    x.requires_grad_()
    outs = neck([x])
    params = dict(neck.named_parameters())
    want = fpn_reference(neck, x_ref, norm_cfg and norm_cfg['num_groups'])
    assert len(outs) == len(want) == num_outs
    weights = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
    for out, ref in zip(outs, want):
        torch.testing.assert_close(out, ref, **_F64_TOL)
    got_grads = torch.autograd.grad(
        sum((o * w).sum() for o, w in zip(outs, weights)),
        [x] + list(params.values()))
    ref_grads = torch.autograd.grad(
        sum((o * w).sum() for o, w in zip(want, weights)),
        [x_ref] + list(params.values()))
    for name, got, ref in zip(['input'] + list(params), got_grads,
                              ref_grads):
        torch.testing.assert_close(got, ref, **_F64_TOL, msg=name)


@pytest.mark.parametrize('extra_type', ['maxpool', 'conv'])
def test_out_convs_are_a_1x1_conv_and_group_norm_per_level(extra_type):
    """``out_norm_cfg``: every level (the extra one too) of the pyramid
    reference through a biased 1x1 conv and GroupNorm(4), forward and
    backward, on random weights; the pyramid's own weights and names are
    those of the neck without ``out_norm_cfg``."""
    torch.manual_seed(0)
    kwargs = dict(scale_factors=(2.0, 1.0, 0.5), num_outs=4,
                  extra_type=extra_type, norm_cfg=dict(type='LayerNorm2d'))
    neck = ViTSimpleFPN(16, 8, out_norm_cfg=dict(type='GN', num_groups=4),
                        **kwargs).double()
    pyramid = ViTSimpleFPN(16, 8, **kwargs)
    assert set(pyramid.state_dict()) == {
        k for k in neck.state_dict() if not k.startswith('out_convs.')}
    assert len(neck.out_convs) == 4
    with torch.no_grad():
        for param in neck.parameters():
            param.normal_(0, 0.5)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, 5, 7, generator=g, dtype=torch.float64)
    x_ref = x.clone().requires_grad_()
    x.requires_grad_()
    outs = neck([x])
    want = []
    for level, out_conv in zip(fpn_reference(neck, x_ref), neck.out_convs):
        conv, norm = out_conv.conv, out_conv.gn
        y = F.conv2d(level, conv.weight, conv.bias)
        want.append(F.group_norm(y, 4, norm.weight, norm.bias, norm.eps))
    assert len(outs) == len(want) == 4
    for out, ref in zip(outs, want):
        torch.testing.assert_close(out, ref, **_F64_TOL)
    params = dict(neck.named_parameters())
    weights = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
    got_grads = torch.autograd.grad(
        sum((o * w).sum() for o, w in zip(outs, weights)),
        [x] + list(params.values()))
    ref_grads = torch.autograd.grad(
        sum((o * w).sum() for o, w in zip(want, weights)),
        [x_ref] + list(params.values()))
    for name, got, ref in zip(['input'] + list(params), got_grads,
                              ref_grads):
        torch.testing.assert_close(got, ref, **_F64_TOL, msg=name)


def test_simple_fpn_norm_cfg_and_registry():
    from mmdet.registry import MODELS
    neck = MODELS.build(
        dict(
            type='ViTSimpleFPN',
            in_channels=[32],
            out_channels=16,
            norm_cfg=dict(type='GN', num_groups=4)))
    assert neck.in_channels == 32
    outs = neck([torch.randn(1, 32, 3, 4)])
    assert [o.shape[-2:] for o in outs] == [(12, 16), (6, 8), (3, 4), (2, 2)]
    neck.init_weights()


@pytest.mark.parametrize('kwargs,match', [
    (dict(scale_factors=(3.0, )), 'scale_factors'),
    (dict(scale_factors=(1.0, 2.0)), 'scale_factors'),
    (dict(scale_factors=()), 'scale_factors'),
    (dict(num_outs=2), 'num_outs'),
    (dict(extra_type='avgpool', num_outs=5), 'extra_type'),
    (dict(in_channels=[16, 32]), 'in_channels'),
    (dict(in_channels=18), 'divisible by 4'),
    (dict(out_channels=0), 'out_channels'),
    (dict(out_norm_cfg=dict(type='BN')), r"`out_norm_cfg` \{'type': 'BN'\}, "
     'please give a GroupNorm config'),
    (dict(out_norm_cfg='GN'), "`out_norm_cfg` 'GN'"),
])
def test_simple_fpn_bad_arguments(kwargs, match):
    args = dict(in_channels=16, out_channels=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ViTSimpleFPN(**args)
