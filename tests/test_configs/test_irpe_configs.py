"""Every DETR / DETR-iRPE config builds and trains one step on two images of
different sizes and aspect ratios (pretrained weights switched off), with the
RPE-table recipe of the authors' DETR code; the paper's ImageNet recipe is one
``_base_`` line away."""
import glob
import math
import os.path as osp
import shutil

import pytest
import torch
from mmdet.registry import MODELS
from mmengine.config import Config

import mmpe  # noqa: F401
from config_steps import detection_train_step, weight_decays
from mmpe.models.layers.irpe.irpe import iRPE

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


# The authors' DETR code (microsoft/Cream, iRPE/DETR-with-iRPE):
# models/transformer.py `Transformer._reset_parameters` runs xavier_uniform_
# on every parameter with dim > 1, the RPE tables in their layout included:
# bias (H', buckets), contextual on q / k (H', head_dim, buckets), on v
# (H', buckets, head_dim), H' = 1 when shared; main.py gives every parameter
# AdamW weight decay args.weight_decay = 1e-4.
AUTHORS_WEIGHT_DECAY = 1e-4
# The paper's ImageNet recipe: zero tables, no decay on them.
IMAGENET_RECIPE = dict(init='zeros', weight_decay=0.0)


def _authors_xavier_bound(mode, on, heads, head_dim, buckets):
    """U(-b, b) bound of torch's xavier_uniform_ on the authors' table."""
    if mode == 'bias':
        shape = (heads, buckets)
    elif on == 'v':
        shape = (heads, buckets, head_dim)
    else:
        shape = (heads, head_dim, buckets)
    receptive = math.prod(shape[2:])
    fan_in, fan_out = shape[1] * receptive, shape[0] * receptive
    return math.sqrt(6.0 / (fan_in + fan_out))


def _check_table_recipe(model, cfg, init, weight_decay):
    rpes = [m for m in model.modules() if isinstance(m, iRPE)]
    assert rpes
    attn_cfg = cfg.model.encoder.layer_cfg.self_attn_cfg
    heads = attn_cfg.num_heads
    head_dim = attn_cfg.embed_dims // heads
    for r in rpes:
        assert r.init == init
        table = r.table.detach()
        if init == 'zeros':
            assert torch.count_nonzero(table) == 0
            continue
        bound = _authors_xavier_bound(
            r.mode, r.on, 1 if r.shared_head else heads, head_dim,
            r.num_buckets)
        assert table.abs().max() <= bound
        # U(-b, b) has std b / sqrt(3); 30 %: a few hundred samples at least
        assert abs(table.std().item() * math.sqrt(3) / bound - 1) < 0.3
    decays = weight_decays(model, cfg)
    tables = {n: d for n, d in decays.items() if n.endswith('.table')}
    assert len(tables) == len(rpes)
    assert set(tables.values()) == {weight_decay}
    # every other encoder weight: the authors' decay, whatever the recipe
    others = {
        d
        for n, d in decays.items()
        if n.startswith('encoder.') and not n.endswith('.table')
    }
    assert others == {AUTHORS_WEIGHT_DECAY}


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
    if rpes:  # every DETR-iRPE config: the authors' DETR recipe
        _check_table_recipe(model, cfg, 'xavier', AUTHORS_WEIGHT_DECAY)

    detection_train_step(model, model_cfg.bbox_head.num_classes)
    for r in rpes:
        assert r.table.grad is not None


@pytest.mark.parametrize('path', [
    'configs/quickstart/detr_irpe_r18_synthetic.py',
    'configs/detr_irpe_ctx_r50_150e.py'
])
def test_imagenet_table_recipe_is_one_base_line_away(path, tmp_path):
    """Naming _base_/irpe_tables/imagenet.py instead of .../detr.py gives
    the paper's ImageNet recipe: zero tables, no weight decay on them, every
    other parameter unchanged (weight decay 1e-4)."""
    shutil.copytree(osp.join(ROOT, 'configs'), tmp_path / 'configs')
    copy = tmp_path / path
    text = copy.read_text()
    line = "irpe_tables/detr.py'"  # the _base_ entry, not the comments
    assert text.count(line) == 1
    copy.write_text(text.replace(line, "irpe_tables/imagenet.py'"))
    cfg = Config.fromfile(str(copy))
    if cfg.model.backbone.get('init_cfg'):
        cfg.model.backbone.init_cfg = None
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    _check_table_recipe(model, cfg, IMAGENET_RECIPE['init'],
                        IMAGENET_RECIPE['weight_decay'])
