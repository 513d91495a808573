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
    for (id_a, *got_dets), (id_b, *want_dets) in zip(
            _detections(onnx_pkl), _detections(torch_pkl), strict=True):
        assert id_a == id_b
        _assert_same_detections(got_dets, want_dets, f'image {id_a}')


#: onnxruntime vs PyTorch: float32 graphs that sum in another order
SCORE_ATOL = 1e-4
BOX_ATOL = 1e-2  # pixels, after rescaling to the original image


def _tie_groups(scores, tol):
    """[start, stop) rank ranges of scores sorted high to low, split where
    two neighbours differ by more than ``tol``."""
    cuts = [0] + [i for i in range(1, len(scores))
                  if scores[i - 1] - scores[i] > tol] + [len(scores)]
    return list(zip(cuts[:-1], cuts[1:]))


def _assert_same_detections(got, want, where):
    """Every detection of ``want`` (scores, labels, boxes; top-k ranked by
    score) is in ``got`` with its label, its box and its score, one to one.

    Ranks are compared only where the order is decided: two runtimes that
    agree on each score to ``SCORE_ATOL`` may order two detections whose
    scores differ by at most twice that either way, but keep the order of
    any two further apart. So both lists split at the same places into
    groups of near ties, each group holds the same detections, and only the
    order inside a group is free. A query whose two best classes tie to the
    tolerance would still fail (the outputs do not hold the runner-up).
    """
    (s_a, l_a, b_a), (s_b, l_b, b_b) = got, want
    assert len(s_a) == len(s_b) > 0, where
    assert (np.diff(s_a) <= 0).all() and (np.diff(s_b) <= 0).all(), where
    # each score within the bound; holds for the sorted lists whatever the
    # pairing of the detections is
    np.testing.assert_allclose(s_a, s_b, atol=SCORE_ATOL, err_msg=where)
    for start, stop in _tie_groups(s_b, 2 * SCORE_ATOL):
        free = list(range(start, stop))
        for i in range(start, stop):
            match = [
                j for j in free
                if l_a[j] == l_b[i] and abs(s_a[j] - s_b[i]) <= SCORE_ATOL
                and np.abs(b_a[j] - b_b[i]).max() <= BOX_ATOL
            ]
            assert match, (
                f'{where}: PyTorch detection at rank {i} (label {l_b[i]}, '
                f'score {s_b[i]}, box {b_b[i]}) has no match in onnxruntime '
                f'ranks {start}..{stop - 1}: labels {l_a[start:stop]}, '
                f'scores {s_a[start:stop]}, boxes {b_a[start:stop]}')
            free.remove(match[0])


def test_same_detections_allows_only_near_tie_reordering():
    boxes = np.arange(16, dtype=np.float32).reshape(4, 4) * 10
    want = (np.array([0.9, 0.5, 0.49995, 0.1]), np.array([1, 2, 3, 1]),
            boxes)
    # ranks 1 and 2 swapped: their scores tie within the tolerance
    swapped = [1e-5 + want[0][[0, 2, 1, 3]], want[1][[0, 2, 1, 3]],
               boxes[[0, 2, 1, 3]]]
    swapped[0][1:3] = 0.49998, 0.49997  # onnxruntime's order
    _assert_same_detections(swapped, want, 'near tie')
    for bad in ([want[0], np.array([1, 2, 3, 2]), boxes],  # a label
                [want[0], want[1], boxes + 1],  # the boxes
                [want[0] + 3e-4, want[1], boxes]):  # the scores
        with pytest.raises(AssertionError):
            _assert_same_detections(bad, want, 'different')
    # ranks 0 and 1 are far apart: their order is not free
    far = (np.array([0.9, 0.5, 0.49995, 0.1]), want[1][[1, 0, 2, 3]],
           boxes[[1, 0, 2, 3]])
    with pytest.raises(AssertionError, match='no match'):
        _assert_same_detections(far, want, 'far')
