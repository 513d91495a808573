"""End to end: the DINO-ViTDet quick-start (tiny ViT-iRPE in ViTDet's
layout, mmdet's 4-scale DINO, mmcv's multi-scale deformable attention on the
CPU) trains with tools/train.py and is evaluated with tools/test.py."""
import math
import os.path as osp

import pytest

# the e2e tests' tiny data set, options, runner and log reader
from test_train_test_e2e import _losses, _options, _run, tiny_data  # noqa: F401,E501

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
CONFIG = osp.join(ROOT, 'configs', 'quickstart',
                  'dino_vit-tiny-irpe_vitdet_synthetic.py')

pytestmark = pytest.mark.slow


def test_dino_quickstart_trains_and_tests(tiny_data, tmp_path):  # noqa: F811
    work_dir = str(tmp_path / 'dino')
    _run(['tools/train.py', CONFIG, '--work-dir', work_dir, '--cfg-options',
          *_options(tiny_data, 1)])
    losses = _losses(work_dir)
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses.values())
    proc = _run([
        'tools/test.py', CONFIG, osp.join(work_dir, 'epoch_1.pth'),
        '--work-dir', str(tmp_path / 'dino_test'), '--cfg-options',
        *_options(tiny_data, 1)
    ])
    assert 'coco/bbox_mAP' in proc.stdout + proc.stderr
