"""The BoxRPB configs (``decoder_pe``; COCO and quick-start, with and
without encoder iRPE) build mmpe's DAB-DETR / Conditional DETR on mmdet's,
with the bias in every decoder layer, and train one step on two images of
different sizes and aspect ratios (pretrained weights switched off)."""
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmengine.config import Config

import mmpe  # noqa: F401
from config_steps import detection_train_step
from mmpe.models.layers import BiasedConditionalAttention, BoxRPB
from mmpe.models.layers.irpe.irpe import iRPE

ROOT = osp.join(osp.dirname(__file__), '..', '..')
# config -> (registered type, mmdet detector, BoxRPB mode, layers, encoder
#            iRPE, stride, epochs or None for the quick-start schedule)
CONFIGS = {
    'configs/dab-detr_box-rpb_r50_50e_coco.py':
    ('PEDABDETR', 'DABDETR', 'box', 6, False, 32, 50),
    'configs/dab-detr_irpe-ctx_box-rpb_r50_50e_coco.py':
    ('PEDABDETR', 'DABDETR', 'box', 6, True, 32, 50),
    'configs/conditional-detr_point-rpb_r50_50e_coco.py':
    ('PEConditionalDETR', 'ConditionalDETR', 'point', 6, False, 32, 50),
    'configs/conditional-detr_irpe-ctx_point-rpb_r50_50e_coco.py':
    ('PEConditionalDETR', 'ConditionalDETR', 'point', 6, True, 32, 50),
    'configs/quickstart/dab-detr_box-rpb_r18_synthetic.py':
    ('PEDABDETR', 'DABDETR', 'box', 3, False, 8, None),
    'configs/quickstart/dab-detr_irpe_box-rpb_r18_synthetic.py':
    ('PEDABDETR', 'DABDETR', 'box', 3, True, 8, None),
    'configs/quickstart/conditional-detr_point-rpb_r18_synthetic.py':
    ('PEConditionalDETR', 'ConditionalDETR', 'point', 3, False, 8, None),
    'configs/quickstart/conditional-detr_irpe_point-rpb_r18_synthetic.py':
    ('PEConditionalDETR', 'ConditionalDETR', 'point', 3, True, 8, None),
}


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_builds_and_trains_one_step(path):
    detector, plain, mode, layers, irpe, stride, epochs = CONFIGS[path]
    cfg = Config.fromfile(osp.join(ROOT, path))
    if cfg.model.backbone.get('init_cfg'):
        cfg.model.backbone.init_cfg = None  # no downloads in tests
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    assert type(model).__name__ == detector
    assert plain in [c.__name__ for c in type(model).__mro__]
    if epochs is not None:  # mmdet's 50-epoch schedule, lr drop at 40
        assert cfg.train_cfg.max_epochs == epochs
        assert cfg.param_scheduler[0].milestones == [40]
    rpbs = list(model.decoder.box_rpb)
    assert len(rpbs) == layers == model.decoder.num_layers
    assert all((r.mode, r.offsets, r.stride) == (mode, 'log8', stride)
               for r in rpbs)
    assert all(
        isinstance(layer.cross_attn, BiasedConditionalAttention)
        for layer in model.decoder.layers)
    assert sum(isinstance(m, BoxRPB) for m in model.modules()) == layers
    assert bool([m for m in model.modules() if isinstance(m, iRPE)]) == irpe

    detection_train_step(model, cfg.model.bbox_head.num_classes)
    for r in rpbs:
        for p in r.parameters():
            assert p.grad is not None and torch.count_nonzero(p.grad) > 0
