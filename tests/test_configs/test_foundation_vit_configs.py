"""DINO-4scale on the foundation ViTs (configs/dino-4scale_{dinov2,dinov3,
eva02}-*): every config's backbone is the one its converter describes and
loads the converted keys (DINOv2 with registers, DINOv3, EVA-02 at their
ViT-B / ViT-L sizes, the class and register tokens dropped for the
windows); the detector is the DINO-ViTDet base's; mmdet's detector test
(tests/test_models/test_detectors/test_dino.py: loss, predict and tensor
modes) with the pretrained init stripped and one optimiser step on two
small images, per family (to keep the file quick: ViT-B with 2 of its
blocks, one window and one global, and DINO with one encoder and one
decoder layer and 100 queries; the full DINO runs in
test_dino_vitdet_configs.py); the Mask R-CNN twins of EVA-02 are ViTDet's
Mask R-CNN config but the backbone and the strides of patch 14, and train
one step."""
import copy
import functools
import glob
import inspect
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper

from config_steps import detection_train_step
from foundation_vits import dinov2_shapes, dinov3_state_dict
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.testing import demo_mm_inputs
from mmpe.models.backbones import CPVT
from mmpe.models.utils.dinov2_weights import dinov2_to_mmpe
from mmpe.models.utils.dinov3_weights import dinov3_to_mmpe
from mmpe.models.utils.eva02_weights import eva02_to_mmpe

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
NAMES = sorted(
    osp.relpath(p, REPO) for family in ('dinov2', 'dinov3', 'eva02')
    for p in glob.glob(osp.join(REPO, 'configs',
                                f'dino-4scale_{family}-*.py')))
BASE = 'configs/dino-4scale_vit-b-rel-pos_vitdet_12e_coco.py'
#: ViTDet's Mask R-CNN twins of EVA-02, and a ViTDet Mask R-CNN config
MASK_NAMES = sorted(
    osp.relpath(p, REPO)
    for p in glob.glob(osp.join(REPO, 'configs', 'mask-rcnn_eva02-*.py')))
MASK_BASE = 'configs/mask-rcnn_vit-b-rope-mixed_vitdet_lsj-100e_coco.py'
#: patch 14: the pyramid's strides
STRIDES = [3.5, 7, 14, 28, 56]
#: width, depth, heads of ViT-B / ViT-L
SIZES = {'b': (768, 12, 12), 'l': (1024, 24, 16)}
DEFAULTS = inspect.signature(CPVT).parameters
#: a wide and a tall image, padded in the batch
SHAPES = [(3, 112, 160), (3, 144, 96)]


@functools.lru_cache(maxsize=None)
def _parsed(name):
    return Config.fromfile(osp.join(REPO, name))


def _config(name):
    """A copy of the parsed config (each file parsed once)."""
    return copy.deepcopy(_parsed(name))


def _base():
    return _parsed(BASE)


def _size(name):
    return name.split('_')[1].split('-')[1]


def _converted(name, timm):
    """The converter's weights (meta tensors) and config for the config's
    family and size, as the header's command makes them."""
    dims, depth, heads = SIZES[_size(name)]
    if '_dinov2-' in name:
        sd = {k: torch.empty(s, device='meta')
              for k, s in dinov2_shapes(dims, depth, 4).items()}
        return dinov2_to_mmpe(sd, drop_prefix_tokens=True)
    if '_dinov3-' in name:
        return dinov3_to_mmpe(dinov3_state_dict(dims, depth, heads,
                                                rule=False),
                              drop_prefix_tokens=True)
    with torch.device('meta'):
        model = timm.create_model(
            'eva02_{}_patch14_224'.format('base' if dims == 768 else 'large'),
            pretrained=False)
    buffers = {k for k, _ in model.named_buffers()}
    sd = {k: v for k, v in model.state_dict().items() if k not in buffers}
    return eva02_to_mmpe(sd, ft_grid=(64, 64), window_size=16,
                         drop_prefix_tokens=True)


def test_every_family_has_vit_b_and_vit_l():
    assert NAMES == sorted(
        f'configs/dino-4scale_{f}_vitdet_12e_coco.py'
        for f in ('dinov2-b-reg', 'dinov2-l-reg', 'dinov3-b', 'dinov3-l',
                  'eva02-b', 'eva02-l'))
    assert MASK_NAMES == [f'configs/mask-rcnn_eva02-{s}_vitdet_lsj-100e_'
                          'coco.py' for s in 'bl']


@pytest.mark.parametrize('name', NAMES + MASK_NAMES)
def test_backbone_is_the_converters_and_loads_its_keys(name, timm):
    """Every setting the converter prints is the config's; the backbone
    (built on the meta device) has exactly the converted keys; the
    detector beside it is the DINO-ViTDet base's."""
    cfg = _config(name)
    backbone = cfg.model.backbone
    assert backbone.init_cfg.checkpoint in open(osp.join(REPO, name)).read()
    out, config = _converted(name, timm)
    for key, value in config.items():
        if key == 'type':
            continue
        if key == 'arch':
            dims = value['embed_dims']
            assert int(dims * backbone.arch['mlp_ratio']) == \
                int(dims * value['mlp_ratio'])
            value = {k: v for k, v in value.items() if k != 'mlp_ratio'}
            assert {k: backbone.arch[k] for k in value} == value
            continue
        default = DEFAULTS[key].default  # the argument's default
        assert backbone.get(key, default) == value, key
    args = {k: v for k, v in backbone.items() if k != 'init_cfg'}
    with torch.device('meta'):
        model = MODELS.build(args)
    assert set(model.state_dict()) == set(out)
    if name in MASK_NAMES:
        _check_mask_rcnn_twin(cfg)
        return
    base = _base()
    for key in ('encoder', 'decoder', 'bbox_head', 'dn_cfg', 'train_cfg',
                'test_cfg', 'type'):
        assert cfg.model[key] == base.model[key], key
    neck = copy.deepcopy(base.model.neck)
    neck.in_channels = SIZES[_size(name)][0]
    assert cfg.model.neck == neck
    assert cfg.optim_wrapper == base.optim_wrapper
    assert cfg.param_scheduler == base.param_scheduler


def _check_mask_rcnn_twin(cfg):
    """ViTDet's Mask R-CNN recipe but the backbone, the strides of patch 14
    and EVA-02's layer-wise decay / drop path."""
    base = _config(MASK_BASE)
    assert cfg.model.rpn_head.anchor_generator.strides == STRIDES
    for key in ('bbox_roi_extractor', 'mask_roi_extractor'):
        assert cfg.model.roi_head[key].featmap_strides == STRIDES[:4]
        base.model.roi_head[key].featmap_strides = STRIDES[:4]
    base.model.rpn_head.anchor_generator.strides = STRIDES
    for key in ('rpn_head', 'roi_head', 'train_cfg', 'test_cfg',
                'data_preprocessor', 'type'):
        assert cfg.model[key] == base.model[key], key
    neck = copy.deepcopy(base.model.neck)
    neck.in_channels = cfg.model.backbone.arch['embed_dims']
    assert cfg.model.neck == neck
    large = cfg.model.backbone.arch['embed_dims'] == 1024
    assert cfg.optim_wrapper.paramwise_cfg.layer_decay_rate == (
        0.8 if large else 0.7)
    assert cfg.model.backbone.drop_path_rate == (0.4 if large else 0.1)
    for key in ('train_dataloader', 'param_scheduler', 'train_cfg'):
        assert cfg[key] == base[key], key


def test_mask_rcnn_twin_trains_one_step():
    """ViT-B with 2 of its blocks, two small images with masks (the LSJ
    batch padding to 1024 off, as the ViTDet config tests): one optimiser
    step changes the backbone."""
    cfg = _config(MASK_NAMES[0])
    backbone = cfg.model.backbone
    backbone.init_cfg = None
    backbone.arch = dict(backbone.arch, depth=2)
    backbone.global_blocks = (1, )
    cfg.model.data_preprocessor.batch_augments = None
    # 32 RoIs per image through the 4-conv heads (their convolutions' are
    # the step's time; the backbone is what this config changes)
    cfg.model.train_cfg.rcnn.sampler.num = 32
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    optim = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    before = model.backbone.blocks[0].mlp.fc1_g.weight.detach().clone()
    detection_train_step(model, num_classes=80, with_mask=True)
    optim.step()
    after = model.backbone.blocks[0].mlp.fc1_g.weight
    assert torch.isfinite(after).all() and not torch.equal(before, after)


@pytest.mark.parametrize('name', [n for n in NAMES if _size(n) == 'b'])
def test_loss_predict_tensor_and_one_step(name):
    cfg = _config(name)
    backbone = cfg.model.backbone
    backbone.init_cfg = None
    backbone.arch = dict(backbone.arch, depth=2)
    backbone.global_blocks = (1, )
    # the DINO is the base's (at full size in test_dino_vitdet_configs.py):
    # one encoder and one decoder layer, 100 queries
    cfg.model.encoder.num_layers = cfg.model.decoder.num_layers = 1
    cfg.model.num_queries = 100
    cfg.model.test_cfg.max_per_img = 100
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    optim = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    packed = demo_mm_inputs(2, SHAPES, num_items=[3, 1], num_classes=80)
    model.train()
    data = model.data_preprocessor(packed, True)
    losses = model(**data, mode='loss')
    total, log_vars = model.parse_losses(losses)
    assert torch.isfinite(total), log_vars
    before = model.backbone.blocks[0].attn.qkv.weight.detach().clone()
    optim.update_params(total)
    after = model.backbone.blocks[0].attn.qkv.weight
    assert torch.isfinite(after).all() and not torch.equal(before, after)

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
        assert all(torch.isfinite(t).all() for t in outs)
