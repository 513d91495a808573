"""Every CPVT config builds and trains one step (losses, backward) on a
batch of two images of different sizes and aspect ratios.

The backbone is shrunk through the config (as a user would with
``--cfg-options``); necks and heads are the configs' own. Nothing loads the
ImageNet checkpoint the configs point to.
"""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

import mmpe  # noqa: F401
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = [
    'configs/retinanet_cpvt-s_fpn_1x_coco.py',
    'configs/mask-rcnn_cpvt-s_fpn_1x_coco.py',
    'configs/detr_cpvt-s_150e_coco.py',
    'configs/quickstart/mask-rcnn_cpvt-tiny_synthetic.py',
]
# (C, H, W): wide and tall, neither a multiple of 16 or 32
IMAGE_SHAPES = [(3, 100, 150), (3, 130, 70)]


def _load(name: str) -> Config:
    cfg = Config.fromfile(osp.join(REPO, name))  # a missing file fails
    backbone = cfg.model.backbone
    assert backbone.type == 'CPVT'
    return cfg


@pytest.mark.parametrize('name', CONFIGS)
def test_cpvt_config_trains_one_step(name):
    cfg = _load(name)
    assert 'mmpe' in cfg.custom_imports['imports']
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    # a small CPVT, built through the config as a user would
    backbone = cfg.model.backbone
    embed_dims = 32
    backbone.arch = dict(
        embed_dims=embed_dims, depth=2, num_heads=2, mlp_ratio=2.)
    backbone.init_cfg = None
    cfg.model.neck.in_channels = embed_dims
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.train()

    with_mask = 'roi_head' in cfg.model and 'mask_head' in cfg.model.roi_head
    num_classes = _num_classes(cfg.model)
    data = demo_mm_inputs(
        batch_size=2,
        image_shapes=IMAGE_SHAPES,
        num_items=[3, 2],
        num_classes=num_classes,
        with_mask=with_mask)
    data = model.data_preprocessor(data, training=True)
    losses = model(**data, mode='loss')
    if with_mask:
        assert 'loss_mask' in losses
    loss, log_vars = model.parse_losses(losses)
    assert torch.isfinite(loss), log_vars
    loss.backward()
    grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize('name', CONFIGS[:3])
def test_coco_configs_point_to_converter_output(name):
    cfg = _load(name)
    assert cfg.model.backbone.arch == 'small'
    assert cfg.model.backbone.pos_encoding == 'peg'
    assert cfg.model.backbone.init_cfg.type == 'Pretrained'
    assert cfg.model.backbone.init_cfg.checkpoint == \
        'checkpoints/cpvt-s_deit-in1k.pth'
    assert cfg.model.neck.in_channels == 384
    assert cfg.train_dataloader.dataset.data_root == 'data/coco/'
    with open(osp.join(REPO, name)) as f:
        assert 'timm_vit_to_cpvt.py' in f.read()


def _num_classes(model_cfg) -> int:
    if 'bbox_head' in model_cfg:
        return model_cfg.bbox_head.num_classes
    return model_cfg.roi_head.bbox_head.num_classes
