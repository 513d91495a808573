"""The RT-DETR configs against the released RT-DETRv2 recipes.

The values below are read from lyuwenyu/RT-DETR ``rtdetrv2_pytorch/
configs/rtdetrv2/`` (``include/optimizer.yml``, ``include/dataloader.yml``,
``include/rtdetrv2_r50vd.yml`` and each recipe's file, whose keys replace
the included ones) and ``README.md`` (the released AP), written out here;
the configs must set the same: epochs, the stop epoch of the photometric /
zoom-out / IoU-crop transforms and of the batch-level multi-scale, the
scales, lr and backbone lr, weight decay, clipping, EMA, warm-up, batch,
AMP, the model's sizes.
"""
import copy
import functools
import glob
import os.path as osp
import warnings

import pytest
import torch
from mmengine.config import Config
from mmengine.optim.scheduler import LinearLR

from mmpe.datasets import RTDETR_SCALES

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
#: the authors' values per recipe (YAML), and the README's box AP
RECIPES = {
    'rtdetrv2_r18vd_120e_coco.py': dict(
        yaml='rtdetrv2_r18vd_120e_coco.yml', ap='48.1', depth=18,
        epochs=120, stop=117, scales=None, backbone_lr=1e-4,
        in_channels=[128, 256, 512], hidden_dim=256, expansion=0.5,
        ffn=1024, layers=3, eval_idx=-1, frozen_stem=False,
        frozen_norm=False),
    'rtdetrv2_r34vd_120e_coco.py': dict(
        yaml='rtdetrv2_r34vd_120e_coco.yml', ap='49.9', depth=34,
        epochs=120, stop=117, scales=RTDETR_SCALES, backbone_lr=5e-5,
        in_channels=[128, 256, 512], hidden_dim=256, expansion=0.5,
        ffn=1024, layers=4, eval_idx=-1, frozen_stem=False,
        frozen_norm=False),
    'rtdetrv2_r50vd-m_7x_coco.py': dict(
        yaml='rtdetrv2_r50vd_m_7x_coco.yml', ap='51.9', depth=50,
        epochs=84, stop=81, scales=RTDETR_SCALES, backbone_lr=1e-5,
        in_channels=[512, 1024, 2048], hidden_dim=256, expansion=0.5,
        ffn=1024, layers=6, eval_idx=2, frozen_stem=True, frozen_norm=True),
    'rtdetrv2_r50vd_6x_coco.py': dict(
        yaml='rtdetrv2_r50vd_6x_coco.yml', ap='53.4', depth=50, epochs=72,
        stop=71, scales=RTDETR_SCALES, backbone_lr=1e-5,
        in_channels=[512, 1024, 2048], hidden_dim=256, expansion=1.0,
        ffn=1024, layers=6, eval_idx=-1, frozen_stem=True, frozen_norm=True),
    'rtdetrv2_r101vd_6x_coco.py': dict(
        yaml='rtdetrv2_r101vd_6x_coco.yml', ap='54.3', depth=101,
        epochs=72, stop=71, scales=RTDETR_SCALES, backbone_lr=1e-6,
        in_channels=[512, 1024, 2048], hidden_dim=384, expansion=1.0,
        ffn=2048, layers=6, eval_idx=-1, frozen_stem=True, frozen_norm=True),
}
#: the encoding twins of the R50vd 6x recipe and their AIFI encodings
TWINS = {
    'rtdetrv2_irpe_r50vd_6x_coco.py': 'irpe',
    'rtdetrv2_rope-mixed_r50vd_6x_coco.py': 'rope-mixed',
    'rtdetrv2_log-cpb_r50vd_6x_coco.py': 'log-cpb',
    'rtdetrv2_lookhere_r50vd_6x_coco.py': 'lookhere',
}
#: include/optimizer.yml, dataloader.yml (every recipe)
LR, WEIGHT_DECAY, BETAS, CLIP = 1e-4, 1e-4, (0.9, 0.999), 0.1
EMA_DECAY, EMA_WARMUPS, WARMUP, BATCH = 0.9999, 2000, 2000, 16
SCALES = [480, 512, 544, 576, 608, 640, 640, 640, 672, 704, 736, 768, 800]


@functools.lru_cache(maxsize=None)
def _load(name):
    return Config.fromfile(osp.join(ROOT, 'configs', 'rtdetr', name))


def _cfg(name):
    """The config (a copy: tests may change it)."""
    return copy.deepcopy(_load(name))


def _hooks(cfg):
    return {h['type']: h for h in cfg.custom_hooks}


def test_every_config_is_listed():
    found = {osp.basename(p)
             for p in glob.glob(osp.join(ROOT, 'configs', 'rtdetr', '*.py'))}
    assert found == set(RECIPES) | set(TWINS)
    assert tuple(SCALES) == RTDETR_SCALES


@pytest.mark.parametrize('name', list(RECIPES) + list(TWINS))
def test_recipe_values(name):
    ref = RECIPES.get(name, RECIPES['rtdetrv2_r50vd_6x_coco.py'])
    cfg = _cfg(name)
    # optimiser, clipping, AMP
    optim = cfg.optim_wrapper
    assert optim.type == 'AmpOptimWrapper'
    assert optim.optimizer == dict(type='AdamW', lr=LR, betas=BETAS,
                                   weight_decay=WEIGHT_DECAY)
    assert optim.clip_grad == dict(max_norm=CLIP, norm_type=2)
    assert optim.paramwise_cfg.norm_decay_mult == 0.
    factor = optim.paramwise_cfg.get('lr_factors', {}).get('backbone', 1.)
    assert LR * factor == pytest.approx(ref['backbone_lr'])
    # warm-up then constant
    assert len(cfg.param_scheduler) == 1
    # batch 16 on 4 GPUs
    assert 4 * cfg.train_dataloader.batch_size == BATCH
    assert cfg.auto_scale_lr.base_batch_size == BATCH
    # epochs and the stop of the augmentations / multi-scale
    assert cfg.train_cfg.max_epochs == ref['epochs']
    hooks = _hooks(cfg)
    assert hooks['EMAHook'] == dict(type='EMAHook', ema_type='RTDETREMA',
                                    decay=EMA_DECAY, warmups=EMA_WARMUPS,
                                    priority=49)
    switch = hooks['PipelineSwitchHook']
    assert switch.switch_epoch == ref['stop']
    stopped = {'RandomPhotometricDistort', 'Expand', 'RandomIoUCrop'}
    before = [t['type'] for t in cfg.train_dataloader.dataset.pipeline]
    after = [t['type'] for t in switch.switch_pipeline]
    assert stopped <= set(before) and not stopped & set(after)
    assert [t for t in before if t not in stopped] == after
    augments = cfg.model.data_preprocessor.batch_augments
    if ref['scales'] is None:  # R18: `scales: ~`
        assert augments is None and 'BatchResizeStopHook' not in hooks
    else:
        assert [a['type'] for a in augments] == ['RTDETRBatchResize']
        assert tuple(augments[0].get('scales', RTDETR_SCALES)) == \
            ref['scales']
        assert hooks['BatchResizeStopHook'].stop_epoch == ref['stop']
    # the model's sizes
    model = cfg.model
    assert model.backbone.type == 'PResNetVd'
    assert model.backbone.depth == ref['depth']
    assert model.backbone.out_indices == (1, 2, 3)
    assert (model.backbone.frozen_stages == 0) == ref['frozen_stem']
    assert (not model.backbone.norm_cfg.requires_grad) == ref['frozen_norm']
    assert model.backbone.norm_eval == ref['frozen_norm']
    neck, head = model.neck, model.bbox_head
    assert neck.in_channels == ref['in_channels']
    assert neck.hidden_dim == ref['hidden_dim']
    assert neck.dim_feedforward == ref['ffn']
    assert neck.expansion == ref['expansion']
    assert (neck.use_encoder_idx, neck.num_encoder_layers, neck.num_heads,
            neck.enc_act, neck.act) == ([2], 1, 8, 'gelu', 'silu')
    assert head.in_channels == [ref['hidden_dim']] * 3
    assert (head.num_layers, head.eval_idx) == (ref['layers'],
                                                ref['eval_idx'])
    assert (head.embed_dims, head.num_queries, head.num_points,
            head.num_denoising, head.label_noise_ratio,
            head.box_noise_scale) == (256, 300, [4, 4, 4], 100, 0.5, 1.0)
    assert head.loss_weights == dict(loss_vfl=1.0, loss_bbox=5.0,
                                     loss_giou=2.0)
    assert model.test_cfg.max_per_img == 300
    # the released HungarianMatcher (matcher.py: weight_dict, alpha, gamma,
    # the 1e-8 inside its focal cost's logs)
    assert model.train_cfg.assigner.match_costs == [
        dict(type='FocalLossCost', weight=2.0, alpha=0.25, gamma=2.0,
             eps=1e-8),
        dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
        dict(type='IoUCost', iou_mode='giou', weight=2.0)
    ]
    assert model.data_preprocessor.mean == [0, 0, 0]
    assert model.data_preprocessor.std == [255, 255, 255]


@pytest.mark.parametrize('name', RECIPES)
def test_headers_name_the_yaml_and_target(name):
    with open(osp.join(ROOT, 'configs', 'rtdetr', name)) as f:
        header = f.read().split('_base_')[0]
    ref = RECIPES[name]
    assert ref['yaml'] in header.replace('\n# ', '')
    assert f"released {ref['ap']} box AP" in header


@pytest.mark.parametrize('name,encoding', TWINS.items())
def test_twins_change_only_aifi_encoding(name, encoding):
    twin, base = _cfg(name), _cfg('rtdetrv2_r50vd_6x_coco.py')
    assert twin.model.neck.encoder_pe.absolute == 'sine'
    assert twin.model.neck.encoder_pe.relative.type == encoding
    twin.model.neck.encoder_pe = base.model.neck.encoder_pe
    assert twin.model == base.model
    keys = twin.optim_wrapper.paramwise_cfg.get('custom_keys')
    if keys is not None:  # the encoding's own parameters' weight decay
        base.optim_wrapper.paramwise_cfg.custom_keys = keys
    assert twin.optim_wrapper == base.optim_wrapper


def test_warm_up_is_the_authors_linear_warmup():
    """LinearWarmup (src/optim/warmup.py): lr x min(1, (i + 1) / 2000) at
    iteration i, written out here."""
    cfg = _cfg('rtdetrv2_r50vd_6x_coco.py')
    sched = dict(cfg.param_scheduler[0])
    assert sched.pop('type') == 'LinearLR'
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=LR)
    scheduler = LinearLR(optimizer, **sched)
    lrs = []
    with warnings.catch_warnings():  # no optimiser step: only the lr
        warnings.simplefilter('ignore')
        for _ in range(2100):
            lrs.append(optimizer.param_groups[0]['lr'])
            scheduler.step()
    expected = [LR * min(1.0, (i + 1) / WARMUP) for i in range(2100)]
    assert lrs == pytest.approx(expected, rel=1e-9)


def test_test_pipeline_is_the_authors_eval():
    cfg = _cfg('rtdetrv2_r50vd_6x_coco.py')
    resize = [t for t in cfg.test_dataloader.dataset.pipeline
              if t['type'] == 'Resize'][0]
    assert resize.scale == (640, 640) and resize.keep_ratio is False
    assert resize.backend == 'pillow'
    assert cfg.train_dataloader.dataset.filter_cfg.filter_empty_gt is False
    assert cfg.train_dataloader.drop_last is True
