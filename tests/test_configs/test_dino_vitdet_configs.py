"""DINO on the ViTDet-layout plain ViT (configs/dino-4scale_vit-*_vitdet_*
and their quick-start twin): every config builds; the COCO configs keep
mmdet 3.3's DINO (encoder, decoder, head, data, 12-epoch schedule: compared
with mmdet's own config) and ViTDet's backbone under detrex's DINO-ViTDet
recipe (its optimiser, channel mapper and schedules are checked item by
item in test_dino_vitdet_recipe.py); loss,
predict and tensor modes run on small images (mmdet's
tests/test_models/test_detectors/test_dino.py) with the full ViT-B / ViT-S
and the full DINO; the pyramid gives the levels, strides and channels of
mmdet's R50 DINO (its backbone and channel mapper, built from mmdet's
config, run on the same image); a bad combination is refused when the model
is built; the quick-start trains with a falling loss."""
import copy
import glob
import math
import os.path as osp

import mmdet
import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper

from mmdet.models.detectors import DINO
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.testing import demo_mm_inputs
from mmpe.utils.config_checks import neck_num_outs

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
COCO = sorted(
    osp.relpath(p, REPO)
    for p in glob.glob(osp.join(REPO, 'configs', 'dino-4scale_vit-*.py')))
COCO_12E = [n for n in COCO if n.endswith('_12e_coco.py')]
QUICKSTART = 'configs/quickstart/dino_vit-tiny-irpe_vitdet_synthetic.py'
#: mmdet 3.3's own 4-scale R50 DINO (the file that 'mmdet::dino/...' names)
MMDET_DINO = osp.join(
    osp.dirname(mmdet.__file__), '.mim', 'configs', 'dino',
    'dino-4scale_r50_8xb2-12e_coco.py')
ENCODINGS = ('peg', 'irpe', 'rope-mixed', 'rel-pos')
#: the offset biases (issue 47): 12-epoch configs only
BIAS_ENCODINGS = ('log-cpb', 'alibi-2d', 'lookhere')
#: the parameters of each position encoding in the backbone (2D ALiBi and
#: LookHere have none)
ENCODING_PARAMS = {
    'peg': lambda key: key.startswith('pegs.'),
    'irpe': lambda key: '.attn.rpe_' in key,
    'rope-mixed': lambda key: key.startswith('ropes.'),
    'rel-pos': lambda key: '.attn.rel_pos.' in key,
    'log-cpb': lambda key: '.attn.grid_bias.cpb_mlp.' in key,
    'alibi-2d': None,
    'lookhere': None,
}
#: a wide and a tall image, padded to 256 x 256 in the batch: a 16 x 16
#: grid, i.e. 2 x 2 windows of 14 x 14 (padded), the second image's padding
#: masked in every block
SHAPES = [(3, 240, 256), (3, 256, 160)]


def _encoding(name):
    return next(pe for pe in ENCODINGS + BIAS_ENCODINGS if f'-{pe}_' in name)


def _unscoped(value):
    """A config value without the ``_scope_`` keys that MMEngine adds to
    what a config inherits through ``'mmdet::'``."""
    if isinstance(value, dict):
        return {k: _unscoped(v) for k, v in value.items() if k != '_scope_'}
    if isinstance(value, (list, tuple)):
        return type(value)(_unscoped(v) for v in value)
    return value


def _load(name):
    cfg = Config.fromfile(osp.join(REPO, name))
    cfg.model.backbone.init_cfg = None  # no ImageNet / MAE weights
    return cfg


def test_every_encoding_has_a_config():
    want = {f'configs/dino-4scale_vit-b-{pe}_vitdet_{e}_coco.py'
            for pe in ENCODINGS for e in ('12e', '50e')}
    want.add('configs/dino-4scale_vit-s-irpe_vitdet_12e_coco.py')
    want.update(f'configs/dino-4scale_vit-b-{pe}_vitdet_12e_coco.py'
                for pe in BIAS_ENCODINGS)
    assert set(COCO) == want


@pytest.mark.parametrize('name', COCO + [QUICKSTART])
def test_config_builds(name):
    cfg = _load(name)
    assert 'mmpe' in cfg.custom_imports['imports']
    model = MODELS.build(cfg.model)
    assert type(model).__name__ == 'PaddingAwareDINO'
    assert isinstance(model, DINO)
    backbone = cfg.model.backbone
    windows = [b.window_size for b in model.backbone.blocks]
    assert windows == [0 if i in backbone.global_blocks else
                       backbone.window_size for i in range(len(windows))]
    assert model.backbone.num_skip == 0  # no class token with windows


@pytest.mark.parametrize('name', COCO)
def test_coco_configs_are_mmdet_dino_on_vitdet(name):
    cfg = Config.fromfile(osp.join(REPO, name))
    ref = Config.fromfile(MMDET_DINO)
    for key in ('num_queries', 'with_box_refine', 'as_two_stage', 'encoder',
                'decoder', 'positional_encoding', 'bbox_head', 'dn_cfg',
                'train_cfg', 'test_cfg', 'data_preprocessor'):
        assert _unscoped(cfg.model[key]) == ref.model[key], key
    for key in ('train_dataloader', 'test_dataloader', 'auto_scale_lr'):
        assert _unscoped(cfg[key]) == ref[key], key
    backbone = cfg.model.backbone
    assert backbone.type == 'CPVT' and not backbone.use_cls_token
    assert backbone.window_size == 14
    assert backbone.global_blocks == (2, 5, 8, 11)
    assert backbone.drop_path_rate == 0.1
    assert backbone.final_norm is False  # detectron2's ViT
    assert backbone.arch == ('small' if '_vit-s-' in name else 'base')
    pe = backbone.pos_encoding
    assert _encoding(name) in ((pe, ) if isinstance(pe, str) else pe)
    neck = cfg.model.neck
    assert neck.in_channels == (384 if '_vit-s-' in name else 768)
    assert neck.norm_cfg == dict(type='LayerNorm2d')
    # detrex's channel mapper: GroupNorm(32), as mmdet's R50 DINO's mapper
    assert neck.out_norm_cfg == _unscoped(ref.model.neck.norm_cfg) == dict(
        type='GN', num_groups=32)
    optim = cfg.optim_wrapper
    assert optim.constructor == 'LrFactorOptimWrapperConstructor'
    assert optim.optimizer == dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                                   weight_decay=1e-4)
    assert 'layer_decay_rate' not in optim.paramwise_cfg
    assert _unscoped(optim.clip_grad) == ref.optim_wrapper.clip_grad
    epochs, milestone = (12, 11) if '_12e_' in name else (50, 40)
    assert cfg.train_cfg.max_epochs == epochs
    assert [s.milestones for s in cfg.param_scheduler] == [[milestone]]
    if '_50e_' in name:
        short = Config.fromfile(
            osp.join(REPO, name.replace('_50e_', '_12e_')))
        assert cfg.model == short.model
        assert cfg.optim_wrapper == short.optim_wrapper
    else:
        assert _unscoped(cfg.param_scheduler) == ref.param_scheduler
    with open(osp.join(REPO, name)) as f:
        text = f.read()
    assert 'timm_vit_to_cpvt.py' in text
    assert backbone.init_cfg.checkpoint in text or '_50e_' in name


def test_vit_s_config_is_its_vit_b_config_but_the_size():
    small = Config.fromfile(osp.join(
        REPO, 'configs/dino-4scale_vit-s-irpe_vitdet_12e_coco.py'))
    base = Config.fromfile(osp.join(
        REPO, 'configs/dino-4scale_vit-b-irpe_vitdet_12e_coco.py'))
    for cfg in (small, base):
        cfg.model.backbone.arch = cfg.model.backbone.init_cfg = None
        cfg.model.neck.in_channels = None
    assert small.model == base.model
    assert small.optim_wrapper == base.optim_wrapper


def _pyramid(cfg, image):
    backbone = MODELS.build(cfg.model.backbone)
    neck = MODELS.build(cfg.model.neck)
    with torch.no_grad():
        return neck(backbone(image))


@pytest.mark.parametrize('name', ['configs/dino-4scale_vit-b-peg_vitdet_'
                                  '12e_coco.py', QUICKSTART])
def test_pyramid_has_the_levels_of_mmdet_dino(name):
    """Level count, strides and channels of mmdet's R50 DINO (ResNet-50
    stages 2-4 + one stride-2 conv of its ChannelMapper), measured by
    running mmdet's backbone and neck on the same image."""
    ref = Config.fromfile(MMDET_DINO)
    ref.model.backbone.init_cfg = None
    cfg = _load(name)
    image = torch.randn(1, 3, 128, 192)
    torch.manual_seed(0)
    want = _pyramid(ref, image)
    got = _pyramid(cfg, image)
    levels = ref.model.encoder.layer_cfg.self_attn_cfg.num_levels
    assert levels == ref.model.decoder.layer_cfg.cross_attn_cfg.num_levels
    assert len(want) == ref.model.neck.num_outs == levels == 4
    assert len(got) == levels
    assert cfg.model.encoder.layer_cfg.self_attn_cfg.num_levels == levels
    # strides 8, 16, 32, 64 on a 128 x 192 image
    assert [t.shape[-2:] for t in got] == [t.shape[-2:] for t in want]
    assert [192 // t.shape[-1] for t in got] == [8, 16, 32, 64]
    # channels: the transformer's width (256 on COCO)
    dims = cfg.model.encoder.layer_cfg.self_attn_cfg.embed_dims
    assert {t.shape[1] for t in got} == {cfg.model.neck.out_channels} == {
        dims}
    if name != QUICKSTART:
        assert dims == ref.model.neck.out_channels == 256


#: the config run at full size (12 blocks); the other ViT-B configs run
#: with their first 4 blocks (windows in 0 and 2, global 1 and 3, as the
#: full layout's 0-2), to keep the file's time down
FULL_SIZE = 'configs/dino-4scale_vit-b-irpe_vitdet_12e_coco.py'


@pytest.mark.parametrize('name', COCO_12E)
def test_loss_predict_tensor_modes(name):
    """mmdet's test_dino.py on each COCO config (900 queries, 6 + 6 layers,
    ViT-B / ViT-S of 768 / 384 dims; 12 blocks for FULL_SIZE and ViT-S, 4
    for the other ViT-B), two small images; the backbone's encoding
    parameters get gradients."""
    cfg = _load(name)
    if name != FULL_SIZE and '_vit-b-' in name:
        cfg.model.backbone.arch = dict(embed_dims=768, depth=4, num_heads=12,
                                       mlp_ratio=4.)
        cfg.model.backbone.global_blocks = (1, 3)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    packed = demo_mm_inputs(2, SHAPES, num_items=[3, 1], num_classes=80)
    data = model.data_preprocessor(packed, True)
    losses = model(**data, mode='loss')
    assert isinstance(losses, dict)
    total, log_vars = model.parse_losses(losses)
    assert torch.isfinite(total), log_vars
    total.backward()
    params = dict(model.backbone.named_parameters())
    owns = ENCODING_PARAMS[_encoding(name)] or (lambda key: False)
    owned = [k for k in params if owns(k)]
    assert bool(owned) == (ENCODING_PARAMS[_encoding(name)] is not None)
    for key in owned:
        grad = params[key].grad
        assert grad is not None and torch.isfinite(grad).all(), key
    assert not owned or any(params[k].grad.abs().sum() > 0 for k in owned)
    build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))

    model.eval()
    data = model.data_preprocessor(packed, False)
    with torch.no_grad():
        results = model(**data, mode='predict')
        assert len(results) == 2
        for result, shape in zip(results, SHAPES):
            assert isinstance(result, DetDataSample)
            boxes = result.pred_instances.bboxes
            assert boxes.shape == (cfg.model.test_cfg.max_per_img, 4)
            assert torch.isfinite(boxes).all()
        outs = model(**data, mode='tensor')
        assert isinstance(outs, tuple)
        assert all(torch.isfinite(t).all() for t in outs)


def _bad(cfg, **options):
    cfg = copy.deepcopy(cfg)
    cfg.merge_from_dict(options)
    with pytest.raises(ValueError) as err:
        MODELS.build(cfg.model)
    return str(err.value)


def test_bad_combinations_are_refused_when_built():
    cfg = _load(COCO_12E[0])
    # ViTDet's Mask R-CNN pyramid: 5 levels for DINO's 4
    message = _bad(cfg, **{'model.neck.scale_factors': (4.0, 2.0, 1.0, 0.5),
                           'model.neck.num_outs': 5})
    assert '`neck.num_outs`' in message and '5 feature maps' in message
    assert '`neck.scale_factors`=(4.0, 2.0, 1.0, 0.5)' in message
    # three levels (no pooled level)
    message = _bad(cfg, **{'model.neck.num_outs': None})
    assert '3 feature maps' in message and 'attend to 4 levels' in message
    # the encoder told 5 levels, the detector 4
    message = _bad(cfg, **{
        'model.encoder.layer_cfg.self_attn_cfg.num_levels': 5})
    assert '`encoder.layer_cfg.self_attn_cfg.num_levels`=5' in message
    assert '`num_feature_levels`=4' in message
    # a class token with windows
    message = _bad(cfg, **{'model.backbone.use_cls_token': True})
    assert '`use_cls_token=True`' in message
    assert '`window_size=14`' in message


@pytest.mark.parametrize('neck', [
    dict(type='ViTSimpleFPN', in_channels=[32], out_channels=8),
    dict(type='ViTSimpleFPN', in_channels=32, out_channels=8,
         scale_factors=(2.0, 1.0)),
    dict(type='ViTSimpleFPN', in_channels=32, out_channels=8,
         scale_factors=(2.0, 1.0, 0.5), num_outs=4),
    dict(type='ChannelMapper', in_channels=[8, 16, 32], out_channels=8),
    dict(type='ChannelMapper', in_channels=[8, 16, 32], out_channels=8,
         num_outs=4),
])
def test_neck_level_count_is_what_the_built_neck_gives(neck):
    """The count the build-time check reads from a neck config is the
    number of maps the built neck returns."""
    module = MODELS.build(copy.deepcopy(neck))
    channels = neck['in_channels']
    channels = channels if isinstance(channels, list) else [channels]
    feats = [torch.randn(1, c, 16 // 2**i, 16 // 2**i)
             for i, c in enumerate(channels)]
    with torch.no_grad():
        assert neck_num_outs(neck) == len(module(feats))


def _quickstart_batch(num_classes):
    # two images of the embedded set's sizes (128-256 px, aspect up to 3:1)
    return demo_mm_inputs(2, [(3, 128, 224), (3, 192, 128)],
                          num_items=[3, 2], num_classes=num_classes)


def test_quickstart_trains_with_a_falling_loss():
    cfg = _load(QUICKSTART)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    optim = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    packed = _quickstart_batch(cfg.model.bbox_head.num_classes)
    model.train()
    totals = []
    for i in range(8):
        data = model.data_preprocessor(packed, True)
        losses = model(**data, mode='loss')
        total, _ = model.parse_losses(losses)
        assert math.isfinite(total.item())
        optim.backward(total)
        if i == 0:
            rpe = {k: p.grad for k, p in model.backbone.named_parameters()
                   if '.attn.rpe_' in k}
            assert len(rpe) == 4  # one table per block
            assert all(g is not None and g.abs().sum() > 0
                       for g in rpe.values())
        optim.step()
        optim.zero_grad()
        totals.append(total.item())
    assert totals[-1] < totals[0], totals
