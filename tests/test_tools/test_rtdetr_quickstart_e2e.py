"""End to end: the RT-DETR quick-start (configs/quickstart/
rtdetr_r18vd_synthetic.py: the COCO recipes' augmentations, batch-level
multi-scale, EMA, stop epoch) trains with tools/train.py for two epochs,
the augmentations and the multi-scale stopped for the second, and
tools/test.py evaluates the checkpoint to a COCO table."""
import math
import os.path as osp

import pytest

# the e2e tests' tiny data set, options, runner and log reader
from test_train_test_e2e import _losses, _options, _run, tiny_data  # noqa: F401,E501

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
CONFIG = osp.join(ROOT, 'configs', 'quickstart', 'rtdetr_r18vd_synthetic.py')

pytestmark = pytest.mark.slow


def test_rtdetr_quickstart_trains_and_tests(tiny_data, tmp_path):  # noqa: F811
    work_dir = str(tmp_path / 'rtdetr')
    # the stop epoch moved to 1: epoch 0 with, epoch 1 without
    stop = ['custom_hooks.1.switch_epoch=1', 'custom_hooks.2.stop_epoch=1']
    proc = _run(['tools/train.py', CONFIG, '--work-dir', work_dir,
                 '--cfg-options', *_options(tiny_data, 2, stop)])
    log = proc.stdout + proc.stderr
    assert 'Switch pipeline now!' in log
    assert 'Epoch 1: batch resize off' in log
    losses = _losses(work_dir)
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses.values())
    proc = _run([
        'tools/test.py', CONFIG, osp.join(work_dir, 'epoch_2.pth'),
        '--work-dir', str(tmp_path / 'rtdetr_test'), '--cfg-options',
        *_options(tiny_data, 2)
    ])
    log = proc.stdout + proc.stderr
    assert 'Average Precision  (AP) @[ IoU=0.50:0.95' in log
    assert 'coco/bbox_mAP' in log
