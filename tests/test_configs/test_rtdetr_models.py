"""The RT-DETR configs' models: mmdet's detector test pattern (loss /
predict / tensor modes) on every config, one training step, and every
parameter's lr and weight decay against the authors' regex groups.

The groups are the released YAML's (``rtdetrv2_pytorch/configs/rtdetrv2/
include/optimizer.yml`` and the recipes that replace its ``params``),
written out here and applied as the authors' ``get_optim_params``
(``src/core/yaml_config.py``) applies them: each group takes the trainable
parameters whose *authors'* name matches (``re.findall``), the rest form
the default group (lr 1e-4, weight decay 1e-4). The authors' names come
from their model's layout (``tests/data/rtdetr_authors/
checkpoint_layout.json``) and reach mmpe's parameters through the
converter's key maps.
"""
import copy
import functools
import glob
import importlib.util
import json
import os.path as osp
import re

import pytest
import torch
from mmdet.structures import DetDataSample
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper

from mmdet.registry import MODELS

from config_steps import TWO_SIZES

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = sorted(
    osp.relpath(p, ROOT)
    for p in glob.glob(osp.join(ROOT, 'configs', 'rtdetr', '*.py')))
QUICKSTART = 'configs/quickstart/rtdetr_r18vd_synthetic.py'
LAYOUT = osp.join(ROOT, 'tests', 'data', 'rtdetr_authors',
                  'checkpoint_layout.json')
spec = importlib.util.spec_from_file_location(
    'rtdetrv2_to_mmpe',
    osp.join(ROOT, 'tools', 'model_converters', 'rtdetrv2_to_mmpe.py'))
converter = importlib.util.module_from_spec(spec)
spec.loader.exec_module(converter)

LR, WEIGHT_DECAY = 1e-4, 1e-4
NORMS = '^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn)).*$'
#: the released YAML's parameter groups
GROUPS = {
    # include/optimizer.yml; rtdetrv2_r50vd_6x / r50vd_m_7x restate it
    'r50': [dict(params='^(?=.*backbone)(?!.*norm).*$', lr=1e-5),
            dict(params=NORMS, weight_decay=0.)],
    'r101': [dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=1e-6),
             dict(params=NORMS, weight_decay=0.)],
    'r34': [dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=5e-5),
            dict(params='^(?=.*backbone)(?=.*norm|bn).*$', lr=5e-5,
                 weight_decay=0.),
            dict(params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|bias))'
                 '.*$', weight_decay=0.)],
    'r18': [dict(params='^(?=.*(?:norm|bn)).*$', weight_decay=0.)],
}
#: (authors' layout, config whose model is built, config whose optimiser,
#: the YAML groups): R34's groups on the R18 layout (the same names),
#: R50-m's and R101's on R50's
OPTIMISERS = [
    ('r18', 'rtdetrv2_r18vd_120e_coco.py', 'rtdetrv2_r18vd_120e_coco.py',
     'r18'),
    ('r18', 'rtdetrv2_r18vd_120e_coco.py', 'rtdetrv2_r34vd_120e_coco.py',
     'r34'),
    ('r50', 'rtdetrv2_r50vd_6x_coco.py', 'rtdetrv2_r50vd_6x_coco.py', 'r50'),
    ('r50', 'rtdetrv2_r50vd_6x_coco.py', 'rtdetrv2_r50vd-m_7x_coco.py',
     'r50'),
    ('r50', 'rtdetrv2_r50vd_6x_coco.py', 'rtdetrv2_r101vd_6x_coco.py',
     'r101'),
]
#: parameters an encoding twin adds to AIFI (gradients must reach them)
ENCODING_PARAMS = {'irpe': 'rpe', 'rope-mixed': 'rope.freqs',
                   'log-cpb': 'cpb_mlp', 'lookhere': None}


def _cfg(name):
    path = name if name.startswith('configs') else osp.join(
        'configs', 'rtdetr', name)
    cfg = Config.fromfile(osp.join(ROOT, path))
    cfg.model.backbone.init_cfg = None
    return cfg


def _plain_optim(cfg):
    """The config's optim wrapper without AMP (MMEngine's AMP needs CUDA;
    the parameter groups are the constructor's either way)."""
    optim = copy.deepcopy(cfg.optim_wrapper)
    optim.type = 'OptimWrapper'
    optim.pop('loss_scale', None)
    return optim


@functools.lru_cache(maxsize=None)
def _built(name):
    """The config's model, built once for the parameter-group cases (which
    do not change it)."""
    return MODELS.build(_cfg(name).model)


def authors_groups(names, groups):
    """{authors' trainable name: (lr, weight decay)} by get_optim_params."""
    out = {}
    for group in groups:
        for name in names:
            if re.findall(group['params'], name):
                assert name not in out, f'{name} in two groups'
                out[name] = (group.get('lr', LR),
                             group.get('weight_decay', WEIGHT_DECAY))
    for name in names:
        out.setdefault(name, (LR, WEIGHT_DECAY))
    return out


def _mmpe_name(key):
    if key.startswith('backbone.'):
        return 'backbone.' + converter.presnet_key(key[len('backbone.'):])
    return converter._map(key)


@pytest.mark.parametrize('layout,model_cfg,optim_cfg,groups', OPTIMISERS)
def test_param_groups_follow_the_authors_regexes(layout, model_cfg,
                                                 optim_cfg, groups):
    with open(LAYOUT) as f:
        trainable = json.load(f)['models'][layout]['trainable']
    expected = authors_groups(trainable, GROUPS[groups])
    model = _built(model_cfg)
    optimizer = build_optim_wrapper(model,
                                    _plain_optim(_cfg(optim_cfg))).optimizer
    got = {}
    for group in optimizer.param_groups:
        for p in group['params']:
            got[id(p)] = (group['lr'], group['weight_decay'])
    params = dict(model.named_parameters())
    mmpe_trainable = {k for k, p in params.items() if p.requires_grad}
    mapped = {_mmpe_name(k): k for k in trainable}
    assert set(mapped) == mmpe_trainable
    wrong = [f'{k} ({mapped[k]}): {got[id(params[k])]} vs '
             f'{expected[mapped[k]]}' for k in sorted(mapped)
             if got[id(params[k])] != pytest.approx(expected[mapped[k]])]
    assert not wrong, '\n'.join(wrong[:10])


def test_the_rule_fails_on_a_changed_backbone_lr():
    """Control: the R50 optimiser against R101's groups differs."""
    with open(LAYOUT) as f:
        trainable = json.load(f)['models']['r50']['trainable']
    r50 = authors_groups(trainable, GROUPS['r50'])
    r101 = authors_groups(trainable, GROUPS['r101'])
    assert any(r50[k] != r101[k] for k in trainable)


def _small(cfg):
    """The config's model (every layer and width as configured) at the
    test's size: 30 queries and 20 denoising queries (the weights do not
    depend on them), the batch-level multi-scale (training batches of 480
    to 800 px on COCO) drawing from 128 and 160."""
    augments = cfg.model.data_preprocessor.get('batch_augments')
    if augments:
        augments[0].scales = [128, 160]
    cfg.model.bbox_head.num_queries = 30
    cfg.model.bbox_head.num_denoising = 20
    cfg.model.test_cfg.max_per_img = 30
    return cfg


@pytest.mark.parametrize('name', CONFIGS + [QUICKSTART])
def test_loss_predict_tensor_modes(name):
    """mmdet's detector test pattern on each config's model (its layers and
    widths, 30 queries; two small images of different shapes)."""
    cfg = _small(_cfg(name))
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    num_classes = cfg.model.bbox_head.num_classes
    packed = demo_mm_inputs(2, TWO_SIZES, num_items=[3, 1],
                            num_classes=num_classes)
    model.train()
    data = model.data_preprocessor(packed, True)
    losses = model(**data, mode='loss')
    total, log_vars = model.parse_losses(losses)
    assert torch.isfinite(total), log_vars
    total.backward()
    encoding = cfg.model.neck.encoder_pe.get('relative')
    owner = ENCODING_PARAMS.get(encoding['type']) if encoding else None
    if owner is not None:
        grads = [p.grad for k, p in model.neck.named_parameters()
                 if owner in k]
        assert grads and all(g is not None and torch.isfinite(g).all()
                             for g in grads)
    model.eval()
    data = model.data_preprocessor(packed, False)
    with torch.no_grad():
        results = model(**data, mode='predict')
        assert len(results) == 2
        for result in results:
            assert isinstance(result, DetDataSample)
            boxes = result.pred_instances.bboxes
            assert boxes.shape == (cfg.model.test_cfg.max_per_img, 4)
            assert torch.isfinite(boxes).all()
        outs = model(**data, mode='tensor')
        assert all(torch.isfinite(t).all() for t in outs
                   if isinstance(t, torch.Tensor))


@pytest.mark.parametrize('name', [QUICKSTART, 'rtdetrv2_r18vd_120e_coco.py'])
def test_one_training_step_changes_the_weights(name):
    cfg = _small(_cfg(name))
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    optim = build_optim_wrapper(model, _plain_optim(cfg))
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    packed = demo_mm_inputs(2, TWO_SIZES, num_items=[2, 1],
                            num_classes=cfg.model.bbox_head.num_classes)
    model.train()
    losses = model.train_step(packed, optim)
    assert all(torch.isfinite(v).all() for v in losses.values())
    moved = [k for k, p in model.named_parameters()
             if not torch.equal(p, before[k])]
    assert any(k.startswith('backbone.') for k in moved)
    assert any(k.startswith('neck.') for k in moved)
    assert any(k.startswith('bbox_head.') for k in moved)
