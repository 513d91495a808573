"""The ViTDet-style configs: each builds and trains one step (a shrunk
backbone, as a user would with ``--cfg-options``) on two images of
different sizes; their recipe is ViTDet's (windows, global blocks, LSJ,
AdamW with layer-wise decay); ImageNet weights converted by
tools/model_converters/timm_vit_to_cpvt.py load into the windowed backbone
of the config with only the position encoding's own parameters missing."""
import copy
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper

from config_steps import detection_train_step, weight_decays
from mmdet.registry import MODELS
from mmpe.models.utils.timm_vit import timm_vit_to_cpvt
from vit_layout import timm_vit_shapes

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
COCO = sorted(
    osp.relpath(p, REPO)
    for p in glob.glob(osp.join(REPO, 'configs', 'mask-rcnn_vit-*vitdet*.py')))
QUICKSTART = 'configs/quickstart/mask-rcnn_vit-tiny-peg_vitdet_synthetic.py'
#: the position encoding's own (new) parameters, absent from ImageNet ViTs
NEW_KEYS = {
    'peg': lambda key: key.startswith('pegs.'),
    'irpe': lambda key: '.attn.rpe_' in key,
    'rope-mixed': lambda key: key.startswith('ropes.'),
    'rel-pos': lambda key: '.attn.rel_pos.' in key,
}


def test_every_size_and_encoding_has_a_config():
    want = {f'configs/mask-rcnn_vit-{size}-{pe}_vitdet_lsj-100e_coco.py'
            for size in 'sb'
            for pe in ('peg', 'irpe', 'rope-mixed', 'rel-pos')}
    assert set(COCO) == want


def _load(name, depth=2):
    cfg = Config.fromfile(osp.join(REPO, name))
    backbone = cfg.model.backbone
    backbone.arch = dict(embed_dims=32, depth=depth, num_heads=2,
                         mlp_ratio=2.)
    backbone.global_blocks = (depth - 1, )
    backbone.init_cfg = None
    cfg.model.neck.in_channels = 32
    # 32 RoIs per image instead of 512: the 4-conv box head's cost
    cfg.model.train_cfg.rcnn.sampler.num = 32
    if 'batch_augments' in cfg.model.data_preprocessor:
        # LSJ pads to 1024 x 1024; a frame just over TWO_SIZES (160 x 192)
        # keeps the step cheap
        cfg.model.data_preprocessor.batch_augments[0].size = (192, 192)
    return cfg


@pytest.mark.parametrize(
    'name', [n for n in COCO if '_vit-b-' in n] + [QUICKSTART])
def test_config_trains_one_step(name):
    cfg = _load(name)
    assert 'mmpe' in cfg.custom_imports['imports']
    assert cfg.model.type == 'PaddingAwareMaskRCNN'
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    assert [b.window_size for b in model.backbone.blocks] == [
        cfg.model.backbone.window_size, 0]
    detection_train_step(model, cfg.model.roi_head.bbox_head.num_classes,
                         with_mask=True)
    grads = [p.grad for p in model.backbone.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    # the optimiser of the config builds on this model
    build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))


@pytest.mark.parametrize('name', [n for n in COCO if '_vit-s-' in n])
def test_vit_s_config_is_its_vit_b_config_but_the_size(name):
    """So the ViT-B configs' training step stands for both."""
    small = Config.fromfile(osp.join(REPO, name))
    base = Config.fromfile(osp.join(REPO, name.replace('_vit-s-', '_vit-b-')))
    assert (small.model.backbone.arch, base.model.backbone.arch) == (
        'small', 'base')
    assert small.model.neck.in_channels == 384
    for cfg in (small, base):
        cfg.model.backbone.arch = cfg.model.backbone.init_cfg = None
        cfg.model.neck.in_channels = None
    assert small.model == base.model
    assert small.optim_wrapper == base.optim_wrapper
    assert small.train_dataloader == base.train_dataloader


@pytest.mark.parametrize('name', COCO)
def test_coco_configs_follow_vitdet(name):
    cfg = Config.fromfile(osp.join(REPO, name))
    backbone = cfg.model.backbone
    assert backbone.window_size == 14
    assert backbone.global_blocks == (2, 5, 8, 11)
    assert backbone.drop_path_rate == 0.1 and not backbone.use_cls_token
    assert backbone.arch == ('small' if '_vit-s-' in name else 'base')
    assert cfg.model.neck.in_channels == (384 if '_vit-s-' in name else 768)
    assert cfg.model.neck.norm_cfg == dict(type='LayerNorm2d')
    assert cfg.model.rpn_head.num_convs == 2
    assert cfg.model.roi_head.bbox_head.type == 'Shared4Conv1FCBBoxHead'
    # LSJ at 1024, 25 epochs of the data repeated 4 times = 100 epochs
    train = cfg.train_dataloader.dataset
    assert train.type == 'RepeatDataset' and train.times == 4
    assert cfg.train_cfg.max_epochs == 25
    resize = [t for t in train.dataset.pipeline if t.type == 'RandomResize']
    assert resize[0].scale == (1024, 1024)
    assert resize[0].ratio_range == (0.1, 2.0)
    optim = cfg.optim_wrapper
    assert optim.constructor == 'ViTLayerDecayOptimWrapperConstructor'
    assert optim.optimizer == dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                                   weight_decay=0.1)
    assert optim.paramwise_cfg.layer_decay_rate == 0.7
    with open(osp.join(REPO, name)) as f:
        text = f.read()
    assert 'timm_vit_to_cpvt.py' in text
    assert backbone.init_cfg.checkpoint in text or '_vit-s-' in name


@pytest.mark.parametrize('name', COCO)
def test_no_weight_decay_on_norms_and_position_parameters(name):
    cfg = _load(name)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    for key, decay in weight_decays(model, cfg).items():
        no_decay = ('norm' in key or '.ln' in key or 'rpe_' in key
                    or 'ropes.' in key or 'roi_head' in key and '.gn' in key
                    or key == 'backbone.pos_embed')
        if '.rel_pos.' in key:
            # ViTDet's recipe exempts only the absolute table: its relative
            # tables decay like the weights
            assert decay == 0.1, key
        elif no_decay:
            assert decay == 0., key
        elif key.endswith('weight') and 'norm' not in key:
            assert decay == 0.1, key


def _mae_vit_layout(dims, depth=12, grid=14):
    """Random weights with the names and shapes of a timm / MAE / DeiT ViT
    (class token, table of 1 + 14 * 14 rows, 12 blocks, final norm)."""
    sd = timm_vit_shapes(dims, depth, grid)
    return {k: torch.randn(s) for k, s in sd.items()}


@pytest.mark.parametrize('name', [n for n in COCO if 'rope-mixed' not in n])
def test_converted_vit_loads_into_the_windowed_backbone(name, tmp_path):
    """MAE ViT-B / DeiT-S weights through the converter (for the config's
    ``pos_encoding``, as its comment says): the windowed backbone of the
    config loads them; only the encoding's parameters (PEG, iRPE tables,
    relative-position tables) are new, the absolute table of ViTDet's
    backbone is the ViT's."""
    cfg = Config.fromfile(osp.join(REPO, name))
    dims = 384 if '_vit-s-' in name else 768
    pe = cfg.model.backbone.pos_encoding
    encodings = (pe, ) if isinstance(pe, str) else tuple(pe)
    state = timm_vit_to_cpvt(_mae_vit_layout(dims), pe)
    assert ('pos_embed' in state) == ('learnable' in encodings)
    path = str(tmp_path / 'vit.pth')
    torch.save(dict(state_dict=state), path)
    backbone_cfg = copy.deepcopy(cfg.model.backbone)
    backbone_cfg.init_cfg = dict(type='Pretrained', checkpoint=path)
    model = MODELS.build(backbone_cfg)
    assert model.window_size == 14
    missing, unexpected = model.load_state_dict(state, strict=False)
    new = [NEW_KEYS[e] for e in encodings if e in NEW_KEYS]
    assert not unexpected
    assert missing and all(any(is_new(k) for is_new in new)
                           for k in missing)
    model.init_weights()  # through init_cfg, as training starts
    for key, value in state.items():
        assert torch.equal(model.state_dict()[key], value), key


@pytest.mark.parametrize('size', ['s', 'b'])
def test_converted_rope_mixed_vit_loads_with_its_frequencies(size, timm):
    """timm's RoPE-Mixed ViT (random weights, no download), converted with
    --pos-encoding rope-mixed: every key of the windowed backbone loads."""
    name = f'configs/mask-rcnn_vit-{size}-rope-mixed_vitdet_lsj-100e_coco.py'
    cfg = Config.fromfile(osp.join(REPO, name))
    vit = timm.create_model(
        f'vit_{"small" if size == "s" else "base"}_patch16_rope_mixed_224',
        pretrained=False)
    state = timm_vit_to_cpvt(vit.state_dict(), 'rope-mixed')
    backbone_cfg = copy.deepcopy(cfg.model.backbone)
    backbone_cfg.init_cfg = None
    model = MODELS.build(backbone_cfg)
    model.load_state_dict(state, strict=True)
