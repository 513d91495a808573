"""RT-DETR's backbone, the released PResNet-vd, as mmdet's ResNet-vd: the
key mapping, the released outputs (fixtures of lyuwenyu/RT-DETR, see
``tests/rtdetr_parity.py``; the 640 x 640 and R50 cases run in the neck's
parity test), the average-pool shortcut at odd sizes, and the released
configs' freezing (``freeze_at`` / ``freeze_norm``).
"""
import pytest
import torch
import torch.nn as nn
from rtdetr_parity import (BACKBONE_TYPE, BACKBONES, PARITY_RTOL,
                           build_backbone, fixture, fixture_input,
                           level_errors, released_features, released_state)

from mmdet.registry import MODELS
from mmpe.models.utils.rtdetr_encoder_keys import (convert_presnet,
                                                   hybrid_encoder_key,
                                                   presnet_key)

#: released name -> mmdet's, one of each kind
KEY_EXAMPLES = {
    'conv1.conv1_1.conv.weight': 'stem.0.weight',
    'conv1.conv1_2.norm.running_var': 'stem.4.running_var',
    'conv1.conv1_3.norm.bias': 'stem.7.bias',
    'res_layers.0.blocks.1.branch2b.conv.weight': 'layer1.1.conv2.weight',
    'res_layers.2.blocks.5.branch2c.norm.weight': 'layer3.5.bn3.weight',
    'res_layers.0.blocks.0.short.conv.weight': 'layer1.0.downsample.1.weight',
    'res_layers.0.blocks.0.short.norm.running_mean':
    'layer1.0.downsample.2.running_mean',
    'res_layers.3.blocks.0.short.conv.conv.weight':
    'layer4.0.downsample.1.weight',
    'res_layers.3.blocks.0.short.conv.norm.bias': 'layer4.0.downsample.2.bias',
}
ENCODER_KEY_EXAMPLES = {
    'input_proj.2.norm.running_mean': 'input_proj.2.bn.running_mean',
    'input_proj.1.0.weight': 'input_proj.1.conv.weight',  # version v1
    'input_proj.1.1.bias': 'input_proj.1.bn.bias',
    'encoder.0.layers.0.self_attn.in_proj_weight':
    'encoder.0.layers.0.self_attn.attn.in_proj_weight',
    'encoder.0.layers.0.self_attn.out_proj.bias':
    'encoder.0.layers.0.self_attn.attn.out_proj.bias',
    'encoder.0.layers.0.linear1.weight':
    'encoder.0.layers.0.ffn.layers.0.0.weight',
    'encoder.0.layers.0.linear2.bias': 'encoder.0.layers.0.ffn.layers.1.bias',
    'encoder.0.layers.0.norm2.weight': 'encoder.0.layers.0.norms.1.weight',
    'fpn_blocks.1.bottlenecks.2.conv1.norm.running_var':
    'fpn_blocks.1.bottlenecks.2.conv1.bn.running_var',
    'pan_blocks.0.bottlenecks.0.conv.weight':
    'pan_blocks.0.bottlenecks.0.conv.weight',  # a deployed RepVGG block
    'downsample_convs.1.conv.weight': 'downsample_convs.1.conv.weight',
}


def test_key_mapping_examples():
    for released, ours in KEY_EXAMPLES.items():
        assert presnet_key(released) == ours
    for released, ours in ENCODER_KEY_EXAMPLES.items():
        assert hybrid_encoder_key(released) == ours
    with pytest.raises(KeyError, match='PResNet'):
        presnet_key('backbone.conv1.weight')
    with pytest.raises(KeyError, match='HybridEncoder'):
        hybrid_encoder_key('decoder.input_proj.0.conv.weight')


@pytest.mark.parametrize('name', list(BACKBONES))
def test_released_keys_cover_the_backbone(name):
    backbone = MODELS.build(
        dict(type=BACKBONE_TYPE, out_indices=(1, 2, 3), **BACKBONES[name]))
    mapped = convert_presnet(released_state(name, 'backbone'))
    ours = backbone.state_dict()
    assert set(mapped) == set(ours)
    for key, value in mapped.items():
        assert value.shape == ours[key].shape, key


def test_released_outputs_and_a_control():
    data = fixture('r18')
    records = data['sizes']['480x800']['backbone']
    image = fixture_input('r18', '480x800')
    assert max(level_errors(released_features('r18', '480x800'), records,
                            data['seed'])) < PARITY_RTOL
    backbone = build_backbone('r18')
    with torch.no_grad():
        # control: two output channels of a stage-3 conv swapped
        weight = backbone.layer3[1].conv2.weight
        weight.copy_(weight[[1, 0, *range(2, weight.shape[0])]])
        errors = level_errors(backbone(image), records, data['seed'])
    assert errors[0] < PARITY_RTOL and min(errors[1:]) > 100 * PARITY_RTOL


def test_resnet_v1d_is_presnet_vd_at_depth_50_only():
    # (34 / 101 are built of the blocks of 18 / 50)
    for depth, same in ((18, False), (50, True)):
        ours = MODELS.build(dict(type='PResNetVd', depth=depth)).state_dict()
        mmdet = MODELS.build(dict(type='ResNetV1d', depth=depth)).state_dict()
        missing = {k for k in ours if k not in mmdet}
        assert set(mmdet) <= set(ours)
        # R18: the released stage-1 projection, missing in mmdet's
        assert missing == set() if same else {
            k for k in ours if k.startswith('layer1.0.downsample.')}, depth


def test_average_pool_shortcut_at_odd_sizes():
    # the released shortcut pools with AvgPool2d(2, 2, 0, ceil_mode=True)
    # (padding counted): with no padding, the windows past an odd edge
    # are averaged over their pixels inside, as mmdet's (not counted)
    backbone = MODELS.build(dict(type=BACKBONE_TYPE, depth=18))
    pool = backbone.layer2[0].downsample[0]
    x = torch.randn(2, 4, 7, 9)
    released = nn.AvgPool2d(2, 2, 0, ceil_mode=True)
    torch.testing.assert_close(pool(x), released(x), atol=0, rtol=0)


def test_released_freezing():
    # R50vd: freeze_at=0 (the stem), freeze_norm=True (every BN)
    backbone = MODELS.build(dict(type=BACKBONE_TYPE, **BACKBONES['r50']))
    backbone.train()
    for name, module in backbone.named_modules():
        if isinstance(module, nn.BatchNorm2d):
            assert not module.training, name
    norm_params = {
        f'{name}.{leaf}'
        for name, module in backbone.named_modules()
        if isinstance(module, nn.BatchNorm2d)
        for leaf, _ in module.named_parameters()
    }
    for name, param in backbone.named_parameters():
        frozen = name.startswith('stem.') or name in norm_params
        assert param.requires_grad != frozen, name
    # R18vd: freeze_at=-1, freeze_norm=False: everything trains
    backbone = MODELS.build(dict(type=BACKBONE_TYPE, **BACKBONES['r18']))
    backbone.train()
    out = backbone(torch.randn(2, 3, 64, 64))
    sum(o.sum() for o in out).backward()
    for name, param in backbone.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
