"""The Conditional DETR / DAB-DETR iRPE configs (COCO and quick-start) build
the iRPE detector on mmdet's, with the paper's DETR setting (contextual,
product, piecewise, ratio 1.9 = 7x7 buckets, shared heads, on keys) and the
authors' DETR table recipe, and train one step on two images of different
sizes and aspect ratios (pretrained weights switched off)."""
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
# config -> (registered type, mmdet detector it extends, encoder layers,
#            epochs or None for the quick-start schedule)
CONFIGS = {
    'configs/conditional-detr_irpe-ctx_r50_50e_coco.py':
    ('PEConditionalDETR', 'ConditionalDETR', 6, 50),
    'configs/dab-detr_irpe-ctx_r50_50e_coco.py':
    ('PEDABDETR', 'DABDETR', 6, 50),
    'configs/quickstart/conditional-detr_irpe_r18_synthetic.py':
    ('PEConditionalDETR', 'ConditionalDETR', 3, None),
    'configs/quickstart/dab-detr_irpe_r18_synthetic.py':
    ('PEDABDETR', 'DABDETR', 3, None),
}
# The authors' DETR code (microsoft/Cream, iRPE/DETR-with-iRPE): Xavier on
# every transformer matrix (tables included), AdamW weight decay 1e-4 on
# every parameter (_base_/irpe_tables/detr.py cites both).
AUTHORS_WEIGHT_DECAY = 1e-4


def _build(cfg):
    if cfg.model.backbone.get('init_cfg'):
        cfg.model.backbone.init_cfg = None  # no downloads in tests
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model


def _table_decays(model, cfg):
    """{table name: weight decay of its group in the config's optimizer}."""
    return {
        name: decay
        for name, decay in weight_decays(model, cfg).items()
        if name.endswith('.table')
    }


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_builds_and_trains_one_step(path):
    detector, plain, num_layers, epochs = CONFIGS[path]
    cfg = Config.fromfile(osp.join(ROOT, path))
    model = _build(cfg)
    assert type(model).__name__ == detector
    assert plain in [c.__name__ for c in type(model).__mro__]
    if epochs is not None:  # mmdet's 50-epoch schedule, lr drop at 40
        assert cfg.train_cfg.max_epochs == epochs
        assert cfg.param_scheduler[0].milestones == [40]

    rpes = [m for m in model.modules() if isinstance(m, iRPE)]
    assert len(rpes) == num_layers == model.encoder.num_layers
    names = [n for n, m in model.named_modules() if isinstance(m, iRPE)]
    assert all(n.startswith('encoder.') for n in names)
    for r in rpes:
        assert (r.mode, r.method, r.index, r.on) == ('contextual', 'product',
                                                     'piecewise', 'k')
        assert r.num_buckets == 49 and r.shared_head
        assert r.init == 'xavier' and torch.count_nonzero(r.table) > 0
    assert set(_table_decays(model, cfg).values()) == {AUTHORS_WEIGHT_DECAY}

    detection_train_step(model, cfg.model.bbox_head.num_classes)
    for r in rpes:
        assert r.table.grad is not None
        assert torch.count_nonzero(r.table.grad) > 0


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_imagenet_table_recipe_is_one_base_line_away(path, tmp_path):
    """Naming _base_/irpe_tables/imagenet.py instead of .../detr.py gives
    the paper's ImageNet recipe: zero tables, no weight decay on them."""
    shutil.copytree(osp.join(ROOT, 'configs'), tmp_path / 'configs')
    copy = tmp_path / path
    text = copy.read_text()
    line = "irpe_tables/detr.py'"  # the _base_ entry, not the comments
    assert text.count(line) == 1
    copy.write_text(text.replace(line, "irpe_tables/imagenet.py'"))
    cfg = Config.fromfile(str(copy))
    model = _build(cfg)
    rpes = [m for m in model.modules() if isinstance(m, iRPE)]
    assert rpes and all(r.init == 'zeros' for r in rpes)
    assert all(torch.count_nonzero(r.table) == 0 for r in rpes)
    assert set(_table_decays(model, cfg).values()) == {0.0}
