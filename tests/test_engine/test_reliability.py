"""Mixed sizes, empty and crowded images, bounded caches, bf16 autocast and
2-process DDP for the quick-start DETR-iRPE."""
import copy
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config

from mmpe.datasets import generate_synthetic_coco
from mmpe.models.layers import PEMultiheadAttention
from mmpe.models.layers.irpe.irpe import iRPE

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
CONFIG = osp.join(ROOT, 'configs', 'quickstart', 'detr_irpe_r18_synthetic.py')


def _model():
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(Config.fromfile(CONFIG).model))
    model.init_weights()
    return model


def _stride(model):
    return 2**(1 + len(model.backbone.strides)) if hasattr(
        model.backbone, 'strides') else 16


def _train_step(model, shapes, num_items):
    packed = demo_mm_inputs(
        batch_size=len(shapes),
        image_shapes=shapes,
        num_items=num_items,
        num_classes=4)
    data = model.data_preprocessor(packed, True)
    losses = model(**data, mode='loss')
    total = sum(v for k, v in losses.items() if 'loss' in k)
    total.backward()
    return losses, data


def test_mixed_extreme_aspect_ratios_and_object_counts():
    model = _model().train()
    s = _stride(model)
    # 1:4 next to 4:1, an image with no objects, one with 100 objects
    shapes = [(3, 4 * s, 16 * s), (3, 16 * s, 4 * s), (3, 8 * s, 8 * s),
              (3, 6 * s, 10 * s)]
    losses, data = _train_step(model, shapes, [3, 1, 0, 100])
    for name, value in losses.items():
        assert torch.isfinite(value).all(), name
    assert data['inputs'].shape[-2:] == (16 * s, 16 * s)


def test_one_pixel_wide_feature_grid():
    model = _model().train()
    s = _stride(model)
    losses, _ = _train_step(model, [(3, 12 * s, s), (3, 12 * s, s)], [1, 2])
    assert all(torch.isfinite(v).all() for v in losses.values())


def test_bucket_cache_stays_bounded_for_50_grid_sizes():
    iRPE.cache_clear()
    rpe = iRPE(head_dim=8, num_heads=2)
    x = torch.randn(1, 2, 1, 8)
    for i in range(50):
        h, w = 1 + i % 13, 1 + (7 * i) % 17
        rpe(x.expand(1, 2, h * w, 8).contiguous(), h, w)
    info = iRPE.cache_info()
    assert info.size <= info.maxsize < 50
    assert info.misses >= info.maxsize  # it did evict, it did not grow


def test_bf16_autocast_attention_close_to_fp32():
    torch.manual_seed(0)
    m = PEMultiheadAttention(
        64, 4, batch_first=True, rpe_cfg=dict(), rpe_on='qkv').eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith('table'):
                p.normal_(0, 0.5)
    x = torch.randn(2, 12 * 9, 64)
    want = m(x, spatial_shape=(12, 9))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        got = m(x, spatial_shape=(12, 9))
    assert torch.isfinite(got).all()
    # bf16 keeps 8 bits of mantissa: about 2 decimal digits
    torch.testing.assert_close(got.float(), want, atol=0.1, rtol=0.05)


def test_bf16_autocast_detector_finite():
    model = _model().eval()
    s = _stride(model)
    packed = demo_mm_inputs(
        batch_size=2,
        image_shapes=[(3, 10 * s, 14 * s), (3, 14 * s, 6 * s)],
        num_classes=4)
    data = model.data_preprocessor(packed, False)
    with torch.no_grad():
        want = model(**data, mode='tensor')
        with torch.autocast('cpu', dtype=torch.bfloat16):
            got = model(**data, mode='tensor')
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g.float(), w, atol=0.15, rtol=0.1)


@pytest.mark.slow
def test_dist_train_two_processes_then_test(tmp_path, free_port):
    data_root = str(tmp_path / 'data')
    generate_synthetic_coco(
        data_root, num_train=8, num_val=4, seed=5, min_size=96, max_size=128)
    root = data_root + '/'
    opts = [
        f'train_dataloader.dataset.data_root={root}',
        f'val_dataloader.dataset.data_root={root}',
        f'test_dataloader.dataset.data_root={root}',
        f'val_evaluator.ann_file={root}annotations/instances_val.json',
        f'test_evaluator.ann_file={root}annotations/instances_val.json',
        'train_dataloader.batch_size=2', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        'val_dataloader.num_workers=0',
        'val_dataloader.persistent_workers=False',
        'test_dataloader.num_workers=0',
        'test_dataloader.persistent_workers=False', 'train_cfg.max_epochs=1',
        'train_cfg.val_interval=100'
    ]
    work_dir = str(tmp_path / 'ddp')
    env = dict(
        os.environ,
        OMP_NUM_THREADS='1',
        PYTHON=sys.executable,
        PORT=str(free_port))
    proc = subprocess.run([
        'bash', 'tools/dist_train.sh', CONFIG, '2', '--work-dir', work_dir,
        '--cfg-options', *opts
    ],
                          cwd=ROOT,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert 'Distributed launcher: pytorch' in log or 'world_size: 2' in log \
        or 'Distributed training: True' in log
    ckpt = osp.join(work_dir, 'epoch_1.pth')
    assert osp.isfile(ckpt)
    proc = subprocess.run([
        sys.executable, 'tools/test.py', CONFIG, ckpt, '--work-dir',
        str(tmp_path / 'test'), '--cfg-options', *opts
    ],
                          cwd=ROOT,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    assert 'coco/bbox_mAP' in proc.stdout + proc.stderr
