"""The DINO-ViT COCO configs against detrex's DINO-ViTDet recipe
(IDEA-Research/detrex: projects/dino/configs/dino-vitdet/
dino_vitdet_base_4scale_{12,50}ep.py, models/dino_vitdet.py, configs/common/
optim.py and coco_schedule.py), item by item:

- optimiser: every parameter's lr and weight decay in the optimiser MMEngine
  builds from the config, against detectron2's ``get_default_optimizer_params``
  as detrex calls it, written out here: lr 1e-4 times
  ``lr_factor_func(name) = 0.1 if "backbone" in name else 1`` on detrex's
  parameter names (its ``backbone`` is the ViT *and* the simple pyramid, its
  ``neck`` the channel mapper), weight decay 1e-4 except 0 on the parameters
  of torch's norm layers (``weight_decay_norm=0.0``; detectron2's
  channels-first ``LayerNorm`` of the pyramid is no torch norm layer);
- neck: the built neck's levels equal a 1x1 conv and ``F.group_norm`` (32
  groups) applied here to the levels of the same pyramid without them;
- backbone output: no final norm (the last block's tokens);
- init: every ViT-B config starts from MAE's ViT-B (the header's conversion
  command), the ViT-S one from DeiT-S;
- schedules: 12 epochs with lr x 0.1 at 11, 50 at 40, no warm-up; the
  documented warm-up option (two lines) gives detectron2's linear warm-up;
- headers: each names detrex's config and the number it targets.
"""
import glob
import os.path as osp
import re

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.optim.scheduler import LinearLR
from torch import nn

from mmdet.registry import MODELS
from mmpe.models.necks import LayerNorm2d

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
COCO = sorted(
    osp.relpath(p, REPO)
    for p in glob.glob(osp.join(REPO, 'configs', 'dino-4scale_vit-*.py')))
#: the configs whose models are built here (their encodings' parameters
#: follow detrex's rule like every weight)
BUILT = [
    f'configs/dino-4scale_vit-{size}-{pe}_vitdet_12e_coco.py'
    for size, pe in (('b', 'peg'), ('b', 'irpe'), ('b', 'rope-mixed'),
                     ('b', 'rel-pos'), ('s', 'irpe'))
]
BASE = 'configs/_base_/models/dino-4scale_vit-b_vitdet.py'
REL_POS = 'configs/dino-4scale_vit-b-rel-pos_vitdet_12e_coco.py'

#: detrex's optimiser (configs/common/optim.py AdamW, as the DINO-ViTDet
#: configs set it)
LR, WEIGHT_DECAY, BACKBONE_FACTOR = 1e-4, 1e-4, 0.1
#: detectron2's norm module types (solver/build.py)
TORCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d,
               nn.SyncBatchNorm, nn.GroupNorm, nn.InstanceNorm1d,
               nn.InstanceNorm2d, nn.InstanceNorm3d, nn.LayerNorm,
               nn.LocalResponseNorm)


def _tiny(name, dims=64):
    """The config with a 2-block backbone of ``dims`` channels (the
    parameter names repeat per block), no pre-trained weights."""
    cfg = Config.fromfile(osp.join(REPO, name))
    cfg.model.backbone.init_cfg = None
    cfg.model.backbone.arch = dict(embed_dims=dims, depth=2, num_heads=2,
                                   mlp_ratio=2.)
    cfg.model.backbone.global_blocks = (1, )
    cfg.model.neck.in_channels = dims
    return cfg


def detrex_name(name):
    """mmpe's parameter path as detrex names the same parameter's module
    path: the ViT is ``backbone.net``, the simple pyramid the rest of
    ``backbone`` (detectron2's ``SimpleFeaturePyramid`` holds the ViT),
    the channel mapper ``neck``; DINO's transformer and head have no
    ``backbone`` in their names."""
    if name.startswith('backbone.'):
        return 'backbone.net.' + name[len('backbone.'):]
    if name.startswith('neck.out_convs.'):
        return 'neck.convs.' + name[len('neck.out_convs.'):]
    if name.startswith('neck.'):
        return 'backbone.simfp.' + name[len('neck.'):]
    assert 'backbone' not in name, name
    return 'transformer.' + name


def detrex_groups(model):
    """{parameter: (lr, weight decay)} by detectron2's
    ``get_default_optimizer_params(weight_decay_norm=0.0,
    lr_factor_func=lambda n: 0.1 if "backbone" in n else 1)``."""
    modules = dict(model.named_modules())
    out = {}
    for module_name, module in modules.items():
        for param_name, _ in module.named_parameters(recurse=False):
            name = f'{module_name}.{param_name}' if module_name \
                else param_name
            parent = modules[module_name.rpartition('.')[0]]
            # the pyramid's LayerNorm2d is detectron2's channels-first
            # LayerNorm there: an nn.Module, not one of the norm types
            is_norm = isinstance(module, TORCH_NORMS) and not isinstance(
                parent, LayerNorm2d)
            factor = BACKBONE_FACTOR if 'backbone' in detrex_name(
                name) else 1.
            out[name] = (LR * factor, 0. if is_norm else WEIGHT_DECAY)
    return out


def built_groups(model, cfg):
    optimizer = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    by_param = {}
    for group in optimizer.param_groups:
        for p in group['params']:
            by_param[id(p)] = (group['lr'], group['weight_decay'])
    return {n: by_param[id(p)] for n, p in model.named_parameters()}


@pytest.mark.parametrize('name', BUILT)
def test_param_groups_follow_detrex_rule(name):
    cfg = _tiny(name)
    model = MODELS.build(cfg.model)
    got = built_groups(model, cfg)
    want = detrex_groups(model)
    assert set(got) == set(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-12), key
    # the rule's cases, by value
    for key, value in {
            'backbone.blocks.0.attn.qkv.weight': (1e-5, 1e-4),  # a block
            'backbone.blocks.1.mlp.fc2.bias': (1e-5, 1e-4),  # no layer decay
            'backbone.blocks.0.norm1.weight': (1e-5, 0.),  # a norm
            'neck.lateral_convs.0.conv.weight': (1e-5, 1e-4),  # the pyramid
            'neck.fpn_convs.2.ln.norm.weight': (1e-5, 1e-4),  # detectron2 LN
            'neck.out_convs.3.conv.weight': (1e-4, 1e-4),  # channel mapper
            'neck.out_convs.0.gn.bias': (1e-4, 0.),
            'encoder.layers.0.norms.0.weight': (1e-4, 0.),
            'bbox_head.cls_branches.0.weight': (1e-4, 1e-4),  # DINO's head
            'query_embedding.weight': (1e-4, 1e-4),
    }.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key


def test_the_rule_fails_on_a_changed_lr_factor():
    """The pyramid at the full lr (ViTDet's groups) breaks the rule above."""
    cfg = _tiny(REL_POS)
    cfg.optim_wrapper.paramwise_cfg.lr_factors = {'backbone': 0.1}
    model = MODELS.build(cfg.model)
    got, want = built_groups(model, cfg), detrex_groups(model)
    differ = sorted(k for k in want if got[k] != pytest.approx(want[k]))
    assert differ and all(
        k.startswith(('neck.lateral_convs.', 'neck.fpn_convs.',
                      'neck.stages.')) for k in differ)


@pytest.mark.parametrize('name', [REL_POS, BUILT[4]])
def test_neck_is_the_pyramid_then_a_1x1_conv_and_group_norm(name):
    """Every level of the config's neck = ``F.group_norm(conv1x1(level),
    32)`` of the same pyramid's level without the mapper (float64, random
    affines: the sums of the same terms, perhaps in another order)."""
    cfg = _tiny(name)
    torch.manual_seed(0)
    neck = MODELS.build(cfg.model.neck).double()
    with torch.no_grad():
        for key, param in neck.named_parameters():
            if key.startswith('out_convs.'):
                param.normal_(0, 0.5)
    pyramid_cfg = cfg.model.neck.copy()
    pyramid_cfg.pop('out_norm_cfg')
    pyramid = MODELS.build(pyramid_cfg).double()
    missing, unexpected = pyramid.load_state_dict(neck.state_dict(),
                                                  strict=False)
    assert not missing and unexpected and all(
        k.startswith('out_convs.') for k in unexpected)
    x = torch.randn(2, 64, 5, 7, dtype=torch.float64)
    with torch.no_grad():
        outs, levels = neck([x]), pyramid([x])
    assert len(outs) == len(levels) == 4
    for i, (out, level) in enumerate(zip(outs, levels)):
        conv, gn = neck.out_convs[i].conv, neck.out_convs[i].gn
        assert conv.kernel_size == (1, 1) and conv.bias is not None
        assert gn.num_groups == 32 and out.shape[1] == 256
        want = F.group_norm(
            F.conv2d(level, conv.weight, conv.bias), 32, gn.weight, gn.bias,
            gn.eps)
        torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)


def test_no_final_norm():
    """The backbone gives the last block's tokens as they are."""
    cfg = _tiny(REL_POS)
    backbone = MODELS.build(cfg.model.backbone).eval()
    tokens = []
    backbone.blocks[-1].register_forward_hook(
        lambda m, args, out: tokens.append(out))
    image = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        (out, ) = backbone(image)
    assert isinstance(backbone.norm, nn.Identity)
    assert out.shape == (1, 64, 4, 6)
    torch.testing.assert_close(out.flatten(2).transpose(1, 2), tokens[-1],
                               atol=0, rtol=0)


def test_rel_pos_config_is_detrex_backbone():
    """detectron2's ViT-B of detrex's DINO-ViTDet: the absolute table
    resampled by get_abs_pos, relative tables for 1024 px from zero; the
    windows' padding stays masked (the documented difference)."""
    cfg = Config.fromfile(osp.join(REPO, REL_POS))
    backbone = cfg.model.backbone
    assert backbone.pos_encoding == ('learnable', 'rel-pos')
    assert backbone.pos_embed_interp == 'detectron2'
    assert backbone.rel_pos_cfg == dict(input_size=(64, 64), init='zeros')
    assert backbone.get('window_padding', 'masked') == 'masked'
    assert backbone.final_norm is False


def _header(name):
    with open(osp.join(REPO, name)) as f:
        lines = f.read().split('\n_base_')[0]
    return ' '.join(line.lstrip('# ') for line in lines.splitlines())


@pytest.mark.parametrize('name', [n for n in COCO if '_vit-b-' in n])
def test_vit_b_configs_start_from_mae(name):
    """MAE's ViT-B for every encoding; the rel-pos config keeps MAE's
    absolute table (its converted file), the others drop it."""
    cfg = Config.fromfile(osp.join(REPO, name))
    checkpoint = cfg.model.backbone.init_cfg.checkpoint
    keeps_table = 'learnable' in cfg.model.backbone.pos_encoding
    assert checkpoint == ('checkpoints/vit-b_mae-in1k_cpvt-abs.pth'
                          if keeps_table else
                          'checkpoints/vit-b_mae-in1k_cpvt.pth')
    if '_12e_' in name:
        header = _header(name)
        assert 'mae_pretrain_vit_base.pth' in header
        assert f'mae_pretrain_vit_base.pth {checkpoint}' in header
        assert ('KEEPS MAE\'s absolute table' in header) == keeps_table
        assert ('drops MAE\'s absolute table' in header) != keeps_table


def test_vit_s_config_starts_from_deit_s():
    name = 'configs/dino-4scale_vit-s-irpe_vitdet_12e_coco.py'
    cfg = Config.fromfile(osp.join(REPO, name))
    assert cfg.model.backbone.init_cfg.checkpoint == (
        'checkpoints/cpvt-s_deit-in1k.pth')
    header = _header(name)
    assert 'MAE released no ViT-S' in header
    assert 'Reference number: none' in header


@pytest.mark.parametrize('name', COCO)
def test_schedule_is_detrex_without_warmup(name):
    cfg = Config.fromfile(osp.join(REPO, name))
    epochs, milestone = (50, 40) if '_50e_' in name else (12, 11)
    assert cfg.train_cfg.max_epochs == epochs
    assert cfg.param_scheduler == [cfg.lr_steps]
    assert cfg.lr_steps == dict(type='MultiStepLR', begin=0, end=epochs,
                                by_epoch=True, milestones=[milestone],
                                gamma=0.1)


def test_warmup_option(tmp_path):
    """The two lines of the base's header: detectron2's linear warm-up from
    lr x 0.001 over 1000 iterations, then detrex's steps."""
    config = tmp_path / 'warmup.py'
    config.write_text(
        f"_base_ = '{osp.join(REPO, REL_POS)}'\n"
        'param_scheduler = [{{_base_.lr_warmup}}, {{_base_.lr_steps}}]\n')
    cfg = Config.fromfile(str(config))
    warmup, steps = cfg.param_scheduler
    assert steps == Config.fromfile(osp.join(REPO, REL_POS)).lr_steps
    optimizer = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = LinearLR(optimizer, **{
        k: v for k, v in warmup.items() if k != 'type'})
    assert warmup.type == 'LinearLR' and not warmup.by_epoch
    lrs = []
    for _ in range(1001):
        lrs.append(optimizer.param_groups[0]['lr'])
        optimizer.step()
        scheduler.step()
    # detectron2's WarmupParamScheduler ('linear', factor 0.001, 1000
    # iterations) reaches the lr at iteration 1000, MMEngine's LinearLR at
    # the last of its 1000 (999): at most one iteration's increment apart
    assert lrs[0] == pytest.approx(LR * 0.001, rel=1e-12)
    for it in range(1001):
        alpha = min(it / 1000, 1.)
        want = LR * (0.001 * (1 - alpha) + alpha)
        assert abs(lrs[it] - want) <= LR * 0.999 / 1000 * (1 + 1e-9), it
    assert lrs[999] == lrs[1000] == pytest.approx(LR, rel=1e-12)


@pytest.mark.parametrize('name', COCO)
def test_header_names_detrex_config_and_number(name):
    header = _header(name)
    if '_vit-s-' in name:
        assert 'Reference number: none' in header
        return
    detrex, number = (('dino_vitdet_base_4scale_50ep.py', '55.0')
                      if '_50e_' in name else
                      ('dino_vitdet_base_4scale_12ep.py', '50.2'))
    assert detrex in header and f'box AP {number}' in header
    if name.startswith('configs/dino-4scale_vit-b-rel-pos_'):
        assert re.search(r'the number\s+this config targets', header)
    else:
        assert 'reference point' in header or 'Reference number' in header


def test_base_header_lists_the_recipe_and_the_differences():
    header = _header(BASE)
    for text in ('lr 1e-4', 'weight decay 1e-4', 'lr x 0.1', 'no layer-wise',
                 'GroupNorm(32)', 'no final norm', 'lr x 0.1 at epoch 11',
                 'Where mmpe differs', 'padding is masked', 'temperature 20',
                 'Warm-up: off', 'not stable to train'):
        assert text in header, text
