"""The offset-bias configs of the DETR family (COCO and quick-start: Swin-V2's
log-CPB, 2D ALiBi, LookHere) build the detector they name with the bias in
every encoder self-attention (and nowhere else), keep log-CPB's MLPs out of
weight decay as Swin-V2 does (its ``no_weight_decay_keywords``), keep
mmdet's schedule, and train one step on two images of different sizes and
aspect ratios (pretrained weights switched off)."""
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmengine.config import Config

import mmpe  # noqa: F401
from config_steps import detection_train_step, weight_decays
from mmpe.models.layers import ALiBi2D, LogCPB, LookHere, OffsetBias

ROOT = osp.join(osp.dirname(__file__), '..', '..')
# config -> (registered type, mmdet detector, bias module, encoder layers,
#            (epochs, lr milestones) of mmdet's recipe, or None)
CONFIGS = {
    'configs/detr_log-cpb_r50_150e_coco.py':
    ('PEDETR', 'DETR', LogCPB, 6, (150, [100])),
    'configs/detr_alibi-2d_r50_150e_coco.py':
    ('PEDETR', 'DETR', ALiBi2D, 6, (150, [100])),
    'configs/detr_lookhere_r50_150e_coco.py':
    ('PEDETR', 'DETR', LookHere, 6, (150, [100])),
    'configs/quickstart/detr_log-cpb_r18_synthetic.py':
    ('PEDETR', 'DETR', LogCPB, 3, None),
    'configs/quickstart/detr_alibi-2d_r18_synthetic.py':
    ('PEDETR', 'DETR', ALiBi2D, 3, None),
    'configs/quickstart/detr_lookhere_r18_synthetic.py':
    ('PEDETR', 'DETR', LookHere, 3, None),
    'configs/quickstart/conditional-detr_log-cpb_r18_synthetic.py':
    ('PEConditionalDETR', 'ConditionalDETR', LogCPB, 3, None),
}


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_builds_and_trains_one_step(path):
    detector, plain, bias_type, num_layers, schedule = CONFIGS[path]
    cfg = Config.fromfile(osp.join(ROOT, path))
    if cfg.model.backbone.get('init_cfg'):
        cfg.model.backbone.init_cfg = None  # no downloads in tests
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    assert type(model).__name__ == detector
    assert plain in [c.__name__ for c in type(model).__mro__]
    assert model.abs_pe == 'sine' and model.decoder_pos == 'sine'
    if schedule is not None:
        assert cfg.train_cfg.max_epochs == schedule[0]
        assert cfg.param_scheduler[0].milestones == schedule[1]
    biases = [(n, m) for n, m in model.named_modules()
              if isinstance(m, OffsetBias)]
    assert [n for n, _ in biases] == [
        f'encoder.layers.{i}.self_attn.grid_bias' for i in range(num_layers)
    ]
    assert all(type(m) is bias_type for _, m in biases)

    decay = weight_decays(model, cfg)
    mlp = [n for n in decay if '.cpb_mlp.' in n]
    assert bool(mlp) == (bias_type is LogCPB)
    assert all(decay[n] == 0.0 for n in mlp)
    assert decay['encoder.layers.0.self_attn.attn.in_proj_weight'] == \
        cfg.optim_wrapper.optimizer.weight_decay > 0

    detection_train_step(model, cfg.model.bbox_head.num_classes)
    for _, m in biases:
        for p in m.parameters():
            assert p.grad is not None and torch.count_nonzero(p.grad) > 0


def test_lookhere_config_is_lookhere_90():
    """'corners' over 8 heads: each quadrant twice, the released slopes
    1/2 then 1/4; global and layer slopes 1."""
    cfg = Config.fromfile(
        osp.join(ROOT, 'configs/detr_lookhere_r50_150e_coco.py'))
    model = MODELS.build(cfg.model)
    for layer in model.encoder.layers:
        bias = layer.self_attn.grid_bias
        assert bias.head_directions[:4] == bias.head_directions[4:]
        assert bias.slopes == [0.5] * 4 + [0.25] * 4
