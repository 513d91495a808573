"""tools/train.py and tools/test.py run an mmseg config as they are (the
config's default_scope picks mmseg's registries): a few iterations of the
quick-start Semantic FPN on a tiny generated set, validation with mmseg's
IoUMetric, a plain checkpoint, and ``tools/test.py --out DIR`` writing the
predicted label maps."""
import glob
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from mmpe.datasets import generate_synthetic_seg

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
CONFIG = 'configs/quickstart/fpn_cpvt-tiny_synthetic-seg.py'


def _run(args, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_train_and_test_an_mmseg_config(tmp_path):
    data = str(tmp_path / 'data')
    generate_synthetic_seg(data, num_train=4, num_val=2, min_size=64,
                           max_size=96)
    work = str(tmp_path / 'work')
    opts = [f'{s}_dataloader.dataset.data_root={data}/'
            for s in ('train', 'val', 'test')]
    opts += ['train_cfg.max_iters=2', 'train_cfg.val_interval=2',
             'default_hooks.checkpoint.interval=2',
             'train_dataloader.batch_size=2',
             'model.backbone.arch.depth=1']
    _run(['tools/train.py', CONFIG, '--work-dir', work, '--cfg-options',
          *opts], tmp_path)
    ckpt = osp.join(work, 'iter_2.pth')
    # a plain checkpoint: stock torch opens it weights-only
    assert 'state_dict' in torch.load(ckpt, weights_only=True)
    scalars, = glob.glob(osp.join(work, '*', 'vis_data', 'scalars.json'))
    with open(scalars) as f:
        val = [json.loads(line) for line in f if 'mIoU' in line]
    assert len(val) == 1 and 0 <= val[0]['mIoU'] <= 100

    out = str(tmp_path / 'pred')
    proc = _run(['tools/test.py', CONFIG, ckpt, '--work-dir',
                 str(tmp_path / 'test'), '--out', out, '--cfg-options',
                 *opts], tmp_path)
    assert 'mIoU' in proc.stdout + proc.stderr
    preds = sorted(os.listdir(out))
    assert preds == ['000000.png', '000001.png']
    for name in preds:
        label = np.array(Image.open(osp.join(data, 'seg_maps', 'val',
                                             name)))
        pred = np.array(Image.open(osp.join(out, name)))
        assert pred.shape == label.shape and pred.max() < 5
