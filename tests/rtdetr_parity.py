"""Parity with the released RT-DETR backbone and hybrid encoder: the
fixtures of ``tests/data/rtdetr_authors/`` (made by
``tools/analysis/rtdetr_encoder_fixtures.py`` from lyuwenyu/RT-DETR) and
mmpe's modules loaded with the same weights.

The weights are rebuilt here by the fixtures' rule
(``tools/analysis/rtdetr_weight_rule.py``) under the released names the
fixture lists, then mapped to mmpe's names by
:mod:`mmpe.models.utils.rtdetr_encoder_keys`, so the fixtures also prove
the key mapping.
"""
import json
import os.path as osp
from functools import lru_cache
from typing import Dict, List, Tuple

import torch
from mmdet.registry import MODELS
from rtdetr_weight_rule import level_record, rule_image, rule_state

from mmpe.models.utils.rtdetr_encoder_keys import (convert_hybrid_encoder,
                                                   convert_presnet)

DATA = osp.join(osp.dirname(__file__), 'data', 'rtdetr_authors')
#: float32 through up to 50 conv layers and AIFI: the same sums in another
#: order (the attention's and the FFN's matmuls; mmdet's BN formula vs the
#: released FrozenBatchNorm2d's scale-and-shift) drift by up to ~1.2e-6 of
#: the level's largest value (R50); two of 256 channels of one weight
#: swapped move the outputs by > 3e-3 of it
PARITY_RTOL = 1e-5

#: the registered backbone that computes the released PResNet-vd at
#: every depth (mmdet's ResNetV1d lacks R18 / R34's stage-1 projection)
BACKBONE_TYPE = 'PResNetVd'
#: mmdet's ResNet-vd with the released configs' norm / freezing settings:
#: R18vd (freeze_at=-1, freeze_norm=False), R50vd (freeze_at=0,
#: freeze_norm=True: BN statistics and affine frozen, the stem frozen)
BACKBONES = {
    'r18': dict(depth=18, frozen_stages=-1, norm_eval=False,
                norm_cfg=dict(type='BN', requires_grad=True)),
    'r50': dict(depth=50, frozen_stages=0, norm_eval=True,
                norm_cfg=dict(type='BN', requires_grad=False)),
}


@lru_cache(maxsize=None)
def fixture(name: str) -> Dict:
    with open(osp.join(DATA, f'{name}.json')) as f:
        return json.load(f)


def released_state(name: str, part: str) -> Dict[str, torch.Tensor]:
    """The rule's state dict under the released names of ``part``
    (``'backbone'`` or ``'encoder'``) of fixture ``name``."""
    data = fixture(name)
    return rule_state(data[f'{part}_keys'], data['seed'])


def build_backbone(name: str, backbone_type: str = BACKBONE_TYPE):
    """mmdet's backbone for fixture ``name``, loaded (strictly) with the
    rule's weights mapped from the released names."""
    backbone = MODELS.build(
        dict(type=backbone_type, out_indices=(1, 2, 3), style='pytorch',
             **BACKBONES[name]))
    backbone.load_state_dict(convert_presnet(released_state(name, 'backbone')))
    backbone.eval()  # mmdet's ResNet.train returns None
    return backbone


def build_neck(name: str, **kwargs):
    """:class:`RTDETRHybridEncoder` of fixture ``name``'s setting, loaded
    (strictly) with the rule's weights mapped from the released names."""
    setting = dict(fixture(name)['setting']['encoder'])
    neck = MODELS.build(dict(type='RTDETRHybridEncoder', **setting,
                             **kwargs))
    neck.load_state_dict(
        convert_hybrid_encoder(released_state(name, 'encoder')))
    return neck.eval()


@lru_cache(maxsize=None)
def released_features(name: str, size_name: str) -> Tuple[torch.Tensor]:
    """The backbone's levels of fixture ``name`` at ``size_name`` (kept
    for the tests of the backbone and of the neck)."""
    backbone = build_backbone(name)
    with torch.no_grad():
        return tuple(backbone(fixture_input(name, size_name)))


def fixture_input(name: str, size_name: str) -> torch.Tensor:
    data = fixture(name)
    size = data['sizes'][size_name]['input_size']
    image = torch.tensor(data['image'], dtype=torch.uint8)
    return rule_image(image, tuple(size))


def level_errors(levels: List[torch.Tensor], records: List[Dict],
                 seed: int) -> List[float]:
    """Per level, the largest of: the sampled values' max |difference| and
    the checksums' differences (sum and sum of absolute values relative to
    the sum of absolute values, sum of squares relative to itself), each
    relative to the level's scale (its largest sampled |value|)."""
    errors = []
    for level, ref in zip(levels, records):
        assert list(level.shape) == ref['shape'], (level.shape, ref['shape'])
        ours = level_record(level, seed)
        assert ours['index'] == ref['index']
        scale = max(abs(v) for v in ref['values'])
        sample = max(abs(a - b) for a, b in zip(ours['values'], ref['values']))
        errors.append(max(
            sample / scale,
            abs(ours['sum'] - ref['sum']) / ref['abs_sum'],
            abs(ours['abs_sum'] - ref['abs_sum']) / ref['abs_sum'],
            abs(ours['sq_sum'] - ref['sq_sum']) / ref['sq_sum']))
    return errors
