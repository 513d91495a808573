"""Every DETR / DETR-iRPE config builds and trains one step on two images of
different sizes and aspect ratios (pretrained weights switched off)."""
import glob
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config

import mmpe  # noqa: F401
from mmpe.models.layers.irpe import iRPE

ROOT = osp.join(osp.dirname(__file__), '..', '..')
CONFIGS = sorted(
    glob.glob(osp.join(ROOT, 'configs', 'detr_*r50*.py')) +
    glob.glob(osp.join(ROOT, 'configs', 'quickstart', 'detr_*.py')))

# What each paper config must contain (Tab. 6 rows and the released ones).
EXPECTED = {
    'detr_r50_150e_coco.py': dict(type='DETR', rpe=None, abs_pe=True),
    'detr_nope_r50_150e_coco.py': dict(rpe=None, abs_pe=False),
    'detr_irpe_bias_r50_150e.py': dict(mode='bias', index='piecewise',
                                       buckets=49, abs_pe=True),
    'detr_irpe_ctx_nope_r50_150e.py': dict(mode='contextual', buckets=49,
                                           abs_pe=False),
    'detr_irpe_ctx-clip_r50_150e.py': dict(mode='contextual', index='clip',
                                           buckets=49, abs_pe=True),
    'detr_irpe_ctx_r50_150e.py': dict(mode='contextual', index='piecewise',
                                      buckets=49, abs_pe=True, epochs=150,
                                      milestone=100),
    'detr_irpe_ctx-r2.0_r50_150e.py': dict(mode='contextual', buckets=81,
                                           epochs=150, milestone=100),
    'detr_irpe_ctx_r50_300e.py': dict(mode='contextual', buckets=81,
                                      epochs=300, milestone=200),
}


def test_all_paper_configs_present():
    names = {osp.basename(c) for c in CONFIGS}
    assert set(EXPECTED) <= names


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_builds_and_trains_one_step(path):
    cfg = Config.fromfile(path)
    model_cfg = cfg.model
    if model_cfg.backbone.get('init_cfg'):
        model_cfg.backbone.init_cfg = None  # no downloads in tests
    torch.manual_seed(0)
    model = MODELS.build(model_cfg)
    model.init_weights()
    model.train()

    expected = EXPECTED.get(osp.basename(path), {})
    rpes = [m for m in model.modules() if isinstance(m, iRPE)]
    if 'type' in expected:
        assert model_cfg.type == expected['type']
    if expected.get('rpe', 'x') is None:
        assert not rpes
    if 'mode' in expected:
        assert len(rpes) == model_cfg.encoder.num_layers
        assert all(r.mode == expected['mode'] for r in rpes)
        assert all(r.num_buckets == expected['buckets'] for r in rpes)
        if 'index' in expected:
            assert all(r.index == expected['index'] for r in rpes)
    if 'abs_pe' in expected:
        assert getattr(model, 'use_abs_pe', True) == expected['abs_pe']
    if 'epochs' in expected:
        assert cfg.train_cfg.max_epochs == expected['epochs']
        assert cfg.param_scheduler[0].milestones == [expected['milestone']]
    if rpes and 'r50' in path:
        keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
        assert keys['self_attn.rpe_']['decay_mult'] == 0.0

    packed = demo_mm_inputs(
        batch_size=2,
        image_shapes=[(3, 96, 192), (3, 160, 64)],
        num_items=[2, 1],
        num_classes=model_cfg.bbox_head.num_classes)
    data = model.data_preprocessor(packed, True)
    losses = model(**data, mode='loss')
    total = sum(v for k, v in losses.items() if 'loss' in k)
    assert torch.isfinite(total)
    total.backward()
    for r in rpes:
        assert r.table.grad is not None
