"""ViTLayerDecayOptimWrapperConstructor: every parameter's lr and weight
decay against a hand computation of ViTDet's rule (lr x 0.7 ** (depth + 1 -
layer), layers written out here per parameter name)."""
import re

import pytest
import torch
from mmengine.optim import build_optim_wrapper
from torch import nn

from mmpe.models.backbones import CPVT

BASE_LR, WD, RATE = 1e-4, 0.1, 0.7
DEPTH = 3
#: parameter name pattern -> layer (0: input, i + 1: block i, 4: after)
LAYERS = [
    (r'backbone\.patch_embed\.', 0),
    (r'backbone\.pos_embed$', 0),
    (r'backbone\.blocks\.0\.', 1),
    (r'backbone\.blocks\.1\.', 2),
    (r'backbone\.blocks\.2\.', 3),
    (r'backbone\.ropes\.0\.', 1),
    (r'backbone\.ropes\.1\.', 2),
    (r'backbone\.ropes\.2\.', 3),
    (r'backbone\.pegs\.0\.', 1),  # the PEG after block 0
    (r'backbone\.pegs\.1\.', 3),  # the PEG after block 2
    (r'backbone\.norm\.', 4),
    (r'neck\.', 4),
]


class Detector(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = CPVT(
            arch=dict(embed_dims=16, depth=DEPTH, num_heads=2, mlp_ratio=2.),
            pos_encoding=('learnable', 'peg', 'rope-mixed'),
            peg_positions=(0, 2), window_size=2, global_blocks=(1, ))
        self.neck = nn.Sequential(nn.Linear(16, 8), nn.LayerNorm(8))


def _lr_and_decay(model, paramwise_cfg):
    optim = build_optim_wrapper(
        model,
        dict(
            constructor='ViTLayerDecayOptimWrapperConstructor',
            optimizer=dict(type='AdamW', lr=BASE_LR, weight_decay=WD),
            paramwise_cfg=paramwise_cfg)).optimizer
    by_param = {}
    for group in optim.param_groups:
        for p in group['params']:
            by_param[id(p)] = (group['lr'], group['weight_decay'])
    return {n: by_param[id(p)] for n, p in model.named_parameters()}


def _layer(name):
    found = [layer for pattern, layer in LAYERS if re.match(pattern, name)]
    assert len(found) == 1, name
    return found[0]


def test_lr_of_every_parameter_is_the_hand_computed_one():
    model = Detector()
    got = _lr_and_decay(model, dict(layer_decay_rate=RATE,
                                    norm_decay_mult=0.))
    assert len(got) == len(list(model.parameters()))
    for name, (lr, decay) in got.items():
        want_lr = BASE_LR * RATE**(DEPTH + 1 - _layer(name))
        assert lr == pytest.approx(want_lr, rel=1e-12), name
        is_norm = re.search(r'norm\d?\.|neck\.1\.', name) is not None
        assert decay == (0. if is_norm else WD), name
    # spot checks of the formula: patch embedding 0.7 ** 4, block 1 0.7 ** 2
    assert got['backbone.patch_embed.weight'][0] == pytest.approx(
        1e-4 * 0.2401)
    assert got['backbone.blocks.1.attn.qkv.weight'][0] == pytest.approx(
        1e-4 * 0.49)
    assert got['neck.0.weight'][0] == pytest.approx(1e-4)


def test_custom_keys_multiply_before_the_layer_factor():
    model = Detector()
    got = _lr_and_decay(
        model,
        dict(layer_decay_rate=RATE,
             custom_keys={'blocks.1.mlp': dict(lr_mult=0.5, decay_mult=0.),
                          'neck': dict(lr_mult=2.)}))
    lr, decay = got['backbone.blocks.1.mlp.fc1.weight']
    assert lr == pytest.approx(BASE_LR * 0.5 * RATE**2) and decay == 0.
    assert got['neck.0.weight'][0] == pytest.approx(2 * BASE_LR)
    assert got['backbone.blocks.1.attn.qkv.weight'] == pytest.approx(
        (BASE_LR * RATE**2, WD))


def test_rate_one_is_the_default_constructor():
    model = Detector()
    got = _lr_and_decay(model, dict(layer_decay_rate=1.))
    assert {lr for lr, _ in got.values()} == {BASE_LR}


@pytest.mark.parametrize('rate', [None, 0, 1.5, -0.7, True, '0.7'])
def test_bad_rate_is_named(rate):
    cfg = {} if rate is None else dict(layer_decay_rate=rate)
    with pytest.raises(ValueError, match='`paramwise_cfg.layer_decay_rate`'):
        _lr_and_decay(Detector(), cfg)


def test_backbone_without_layer_ids_is_refused():
    model = nn.Module()
    model.backbone = nn.Linear(2, 2)
    with pytest.raises(ValueError, match='Linear does not say the depth'):
        _lr_and_decay(model, dict(layer_decay_rate=RATE))
