"""The RoPE configs of the DETR family (COCO and quick-start) build the
detector they name with RoPE-2D / RoPE-Mixed in every encoder
self-attention (and nowhere else), keep the frequencies out of weight decay
as the RoPE-ViT authors do, and train one step on two images of different
sizes and aspect ratios (pretrained weights switched off)."""
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmengine.config import Config

import mmpe  # noqa: F401
from config_steps import detection_train_step, weight_decays
from mmpe.models.layers.irpe.irpe import iRPE
from mmpe.models.layers.encodings.rope2d import RoPE2D
from mmpe.models.layers.encodings.rope_mixed import RoPEMixed

ROOT = osp.join(osp.dirname(__file__), '..', '..')
# config -> (registered type, mmdet detector, rotary module, encoder layers,
#            (epochs, lr milestones) of mmdet's recipe, or None)
CONFIGS = {
    'configs/conditional-detr_rope-mixed_r50_50e_coco.py':
    ('PEConditionalDETR', 'ConditionalDETR', RoPEMixed, 6, (50, [40])),
    'configs/detr_rope2d_r50_150e_coco.py':
    ('PEDETR', 'DETR', RoPE2D, 6, (150, [100])),
    'configs/detr_rope-mixed_r50_150e_coco.py':
    ('PEDETR', 'DETR', RoPEMixed, 6, (150, [100])),
    'configs/quickstart/conditional-detr_rope-mixed_r18_synthetic.py':
    ('PEConditionalDETR', 'ConditionalDETR', RoPEMixed, 3, None),
    'configs/quickstart/detr_rope2d_r18_synthetic.py':
    ('PEDETR', 'DETR', RoPE2D, 3, None),
    'configs/quickstart/detr_rope-mixed_r18_synthetic.py':
    ('PEDETR', 'DETR', RoPEMixed, 3, None),
}


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_builds_and_trains_one_step(path):
    detector, plain, rope_type, num_layers, schedule = CONFIGS[path]
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
    assert not [m for m in model.modules() if isinstance(m, iRPE)]
    ropes = [(n, m) for n, m in model.named_modules()
             if isinstance(m, (RoPE2D, RoPEMixed))]
    assert [n for n, _ in ropes] == [
        f'encoder.layers.{i}.self_attn.rope' for i in range(num_layers)
    ]
    assert all(type(m) is rope_type for _, m in ropes)

    decay = weight_decays(model, cfg)
    freqs = [m.freqs for _, m in ropes if isinstance(m, RoPEMixed)]
    names = [f'{n}.freqs' for n, m in ropes if isinstance(m, RoPEMixed)]
    assert len(names) == len(freqs)
    assert all(decay[n] == 0.0 for n in names)
    assert decay['encoder.layers.0.self_attn.attn.in_proj_weight'] == \
        cfg.optim_wrapper.optimizer.weight_decay > 0

    detection_train_step(model, cfg.model.bbox_head.num_classes)
    for f in freqs:
        assert f.grad is not None and torch.count_nonzero(f.grad) > 0
