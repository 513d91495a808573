"""ViTSimpleFPN: strides, channels, extra levels, gradients and errors."""
import pytest
import torch

from mmpe.models.necks import ViTSimpleFPN


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


def test_simple_fpn_identity_level_is_1x1_then_3x3():
    neck = ViTSimpleFPN(16, 8, scale_factors=(1.0, ))
    x = torch.randn(1, 16, 4, 5)
    ref = neck.fpn_convs[0].conv(neck.lateral_convs[0].conv(x))
    torch.testing.assert_close(neck([x])[0], ref)


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
])
def test_simple_fpn_bad_arguments(kwargs, match):
    args = dict(in_channels=16, out_channels=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ViTSimpleFPN(**args)
