"""The DeiT-iRPE detection configs: each builds and trains one step on two
images of different sizes, and the COCO one loads what the converter makes
of the authors' DeiT-S checkpoint.

The backbone is shrunk through the config for the training step (as a user
would with ``--cfg-options``); the authors' checkpoint is stood in for by a
state dict with their names and DeiT-S shapes (their ``models.py``,
``rpe_vision_transformer.py`` and ``irpe.py``), random values.
"""
import importlib.util
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config

import mmpe  # noqa: F401
from vit_layout import timm_vit_shapes

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
COCO = 'configs/mask-rcnn_deit-s-irpe_fpn_1x_coco.py'
QUICKSTART = 'configs/quickstart/mask-rcnn_deit-tiny-irpe_synthetic.py'
AUTHORS_NAME = 'deit_small_patch16_224_ctx_product_50_shared_k'
# (C, H, W): wide and tall, neither a multiple of 16 or 32
IMAGE_SHAPES = [(3, 100, 150), (3, 130, 70)]

spec = importlib.util.spec_from_file_location(
    'deit_irpe_to_mmpe',
    osp.join(REPO, 'tools', 'model_converters', 'deit_irpe_to_mmpe.py'))
conv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(conv)


def _backbone_cfg(cfg):
    backbone = cfg.model.backbone
    assert backbone.type == 'CPVT'
    assert tuple(backbone.pos_encoding) == ('learnable', 'irpe')
    assert backbone.use_cls_token
    return backbone


@pytest.mark.parametrize('name', [COCO, QUICKSTART])
def test_config_trains_one_step(name):
    cfg = Config.fromfile(osp.join(REPO, name))
    assert 'mmpe' in cfg.custom_imports['imports']
    backbone = _backbone_cfg(cfg)
    embed_dims = 32
    backbone.arch = dict(
        embed_dims=embed_dims, depth=2, num_heads=2, mlp_ratio=2.)
    backbone.init_cfg = None
    cfg.model.neck.in_channels = embed_dims
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.train()
    data = demo_mm_inputs(
        batch_size=2,
        image_shapes=IMAGE_SHAPES,
        num_items=[3, 2],
        num_classes=cfg.model.roi_head.bbox_head.num_classes,
        with_mask=True)
    data = model.data_preprocessor(data, training=True)
    losses = model(**data, mode='loss')
    assert 'loss_mask' in losses
    loss, log_vars = model.parse_losses(losses)
    assert torch.isfinite(loss), log_vars
    loss.backward()
    named = dict(model.backbone.named_parameters())
    for key, param in named.items():
        assert param.grad is not None and torch.isfinite(param.grad).all(), \
            key
    # the class token and the iRPE tables are trained too
    assert named['cls_token'].grad.abs().sum() > 0
    assert named['blocks.0.attn.rpe_k.table'].grad.abs().sum() > 0


def _authors_deit_s():
    """Names and shapes of the authors' DeiT-S with contextual product iRPE
    on keys (skip 1): 384 dims, 12 blocks, 6 heads of 64, tables
    (1, 64, 7 * 7 + 1), a 1000-class head."""
    dims, nb = 384, 7 * 7 + 1
    sd = timm_vit_shapes(dims)
    sd.update({'head.weight': (1000, dims), 'head.bias': (1000, )})
    for i in range(12):
        sd[f'blocks.{i}.attn.rpe_k.lookup_table_weight'] = (1, 64, nb)
    return {k: torch.randn(s) for k, s in sd.items()}


def test_coco_config_loads_the_converted_authors_checkpoint(tmp_path):
    cfg = Config.fromfile(osp.join(REPO, COCO))
    backbone = _backbone_cfg(cfg)
    path = f'checkpoints/{AUTHORS_NAME}_mmpe.pth'
    assert backbone.init_cfg == dict(type='Pretrained', checkpoint=path)
    with open(osp.join(REPO, COCO)) as f:
        text = f.read()
    for command in ('tools/model_converters/deit_irpe_to_mmpe.py',
                    f'{AUTHORS_NAME}.pth', path):
        assert command in text
    assert cfg.model.neck.in_channels == 384
    assert cfg.train_dataloader.dataset.data_root == 'data/coco/'

    # the config is the one the converter prints for the authors' file
    src = str(tmp_path / f'{AUTHORS_NAME}.pth')
    dst = str(tmp_path / 'converted.pth')
    torch.save({'model': _authors_deit_s()}, src)
    conv.main([src, dst])
    ckpt = torch.load(dst, map_location='cpu', weights_only=True)
    printed = dict(ckpt['meta']['cpvt'])
    printed.pop('in_channels')
    assert printed.pop('arch') == dict(
        embed_dims=384, depth=12, num_heads=6, mlp_ratio=4.)
    built = dict(backbone)
    assert built.pop('arch') == 'small'
    built['rpe_cfg'] = dict(built['rpe_cfg'])
    # the table init of the recipe (_base_/irpe_tables/imagenet.py) is
    # for training from scratch; the file holds the trained tables
    assert built['rpe_cfg'].pop('init') == 'zeros'
    for key, value in printed.items():
        assert built[key] == value, key

    # and loads it with no missing or unexpected key, through init_cfg
    backbone.init_cfg = dict(type='Pretrained', checkpoint=dst)
    model = MODELS.build(backbone)
    model.init_weights()
    state = ckpt['state_dict']
    for key, value in model.state_dict().items():
        assert torch.equal(value, state.pop(key)), key
    assert not state
