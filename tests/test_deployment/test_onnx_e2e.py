"""End to end: train the quick-start DETR-iRPE for a few iterations,
evaluate the checkpoint with tools/test.py, export it with
tools/deployment/export_onnx.py and evaluate the file in onnxruntime with
tools/deployment/test_onnx.py: the same COCO AP (to the 0.001 the metric
reports) and the same detections."""
import glob
import json
import os
import os.path as osp
import pickle
import subprocess
import sys

import numpy as np
import pytest

from mmpe.datasets import generate_synthetic_coco

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
CONFIG = osp.join(ROOT, 'configs', 'quickstart', 'detr_irpe_r18_synthetic.py')

pytestmark = pytest.mark.slow


def _options(root, max_epochs):
    root = root + '/'
    return [
        f'train_dataloader.dataset.data_root={root}',
        f'val_dataloader.dataset.data_root={root}',
        f'test_dataloader.dataset.data_root={root}',
        f'val_evaluator.ann_file={root}annotations/instances_val.json',
        f'test_evaluator.ann_file={root}annotations/instances_val.json',
        'train_dataloader.batch_size=4',
        'train_dataloader.num_workers=0',
        'val_dataloader.num_workers=0',
        'test_dataloader.num_workers=0',
        # 4 test images of different sizes in one padded batch
        'test_dataloader.batch_size=4',
        f'train_cfg.max_epochs={max_epochs}',
        'train_cfg.val_interval=100',
        f'default_hooks.checkpoint.interval={max_epochs}',
        'randomness.seed=0',
    ]


def _run(args):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONHASHSEED='0')
    proc = subprocess.run([sys.executable, *args],
                          cwd=ROOT,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _detections(path):
    """[(image id, scores (N,), labels (N,), boxes (N, 4))] by image id."""
    with open(path, 'rb') as f:
        results = pickle.load(f)
    out = []
    for result in sorted(results, key=lambda r: r['img_id']):
        pred = result['pred_instances']
        out.append((result['img_id'], np.asarray(pred['scores']),
                    np.asarray(pred['labels']), np.asarray(pred['bboxes'])))
    return out


def test_onnxruntime_ap_equals_tools_test(tmp_path):
    data = str(tmp_path / 'synthetic')
    generate_synthetic_coco(
        data, num_train=8, num_val=4, seed=3, min_size=96, max_size=128)
    epochs = 3
    options = _options(data, epochs)
    work_dir = str(tmp_path / 'run')
    _run(['tools/train.py', CONFIG, '--work-dir', work_dir,
          '--cfg-options', *options])
    ckpt = osp.join(work_dir, f'epoch_{epochs}.pth')

    torch_pkl = str(tmp_path / 'torch.pkl')
    _run(['tools/test.py', CONFIG, ckpt, '--work-dir',
          str(tmp_path / 'test'), '--out', torch_pkl,
          '--cfg-options', *options])
    with open(glob.glob(str(tmp_path / 'test' / '*' / '*.json'))[0]) as f:
        want = json.load(f)

    onnx_file = str(tmp_path / 'detr_irpe.onnx')
    proc = _run(['tools/deployment/export_onnx.py', CONFIG, ckpt,
                 '--out', onnx_file])
    assert 'onnxruntime vs PyTorch max abs difference' in proc.stdout

    onnx_pkl, onnx_json = str(tmp_path / 'onnx.pkl'), str(tmp_path / 'm.json')
    proc = _run(['tools/deployment/test_onnx.py', CONFIG, onnx_file,
                 '--out', onnx_pkl, '--out-json', onnx_json, '--threads',
                 '1', '--cfg-options', *options])
    assert 'Average Precision  (AP) @[ IoU=0.50:0.95' in (proc.stdout +
                                                          proc.stderr)
    with open(onnx_json) as f:
        got = json.load(f)

    keys = [k for k in want if k.startswith('coco/bbox_mAP')]
    assert len(keys) == 6
    for key in keys:
        assert got[key] == pytest.approx(want[key], abs=1e-3), key
    # the same detections: AP alone could agree by chance on a short run
    for (id_a, s_a, l_a, b_a), (id_b, s_b, l_b, b_b) in zip(
            _detections(onnx_pkl), _detections(torch_pkl), strict=True):
        assert id_a == id_b and len(s_a) == len(s_b) > 0
        np.testing.assert_allclose(s_a, s_b, atol=1e-4)
        # top-k order is stable unless two scores tie within that bound
        np.testing.assert_array_equal(l_a, l_b)
        np.testing.assert_allclose(b_a, b_b, atol=1e-2)  # pixels
