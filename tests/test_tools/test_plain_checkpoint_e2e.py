"""End to end: what tools/train.py writes opens with stock
``torch.load(weights_only=True)`` in a Python that cannot import mmpe (nor
mmengine, mmdet, mmcv), and a resumed run ends with the uninterrupted run's
checkpoint: weights, optimizer, message hub histories and RNG states."""
import json
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch

from test_train_test_e2e import (CONFIG, _options, _run,  # noqa: F401
                                 tiny_data)

pytestmark = pytest.mark.slow

# Opens a checkpoint with stock torch only and reports, for every value,
# whether it is plain (checked here, not by mmpe's code).
STOCK_OPEN = r'''
import json, sys
from collections import OrderedDict
for name in ('mmpe', 'mmengine', 'mmdet', 'mmcv'):
    sys.modules[name] = None  # any import of them fails
import torch
ck = torch.load(sys.argv[1], weights_only=True)

def bad(obj, path):
    if isinstance(obj, torch.Tensor) or type(obj) in (bool, int, float, str,
                                                      type(None)):
        return []
    if type(obj) in (dict, OrderedDict):
        return [p for k, v in obj.items() for p in bad(v, f'{path}.{k}')] + [
            f'{path} key {k!r}' for k in obj if type(k) not in (str, int)]
    if type(obj) in (list, tuple):
        return [p for i, v in enumerate(obj) for p in bad(v, f'{path}[{i}]')]
    return [f'{path}: {type(obj)}']

hub = ck['message_hub']
print(json.dumps(dict(
    keys=sorted(ck), not_plain=bad(ck, 'ck'),
    loss_history=hub['log_scalars']['train/loss']['log_history'][
        'data'].tolist(),
    runtime_info=sorted(hub['runtime_info']))))
'''


def _train(work_dir, data_root, max_epochs, resume=False, val_interval=100):
    args = ['tools/train.py', CONFIG, '--work-dir', work_dir]
    if resume:
        args.append('--resume')
    args += [
        '--cfg-options', *_options(data_root, max_epochs),
        f'train_cfg.val_interval={val_interval}'
    ]
    return _run(args)


def _stock_open(path):
    proc = subprocess.run([sys.executable, '-c', STOCK_OPEN, path],
                          cwd='/',
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _load(path):
    return torch.load(path, weights_only=True)


def test_checkpoint_opens_with_stock_torch_without_mmpe(tiny_data, tmp_path):
    work_dir = str(tmp_path / 'run')
    # validation after epoch 1: its metrics land in epoch 2's message hub
    _train(work_dir, tiny_data, max_epochs=2, val_interval=1)
    got = _stock_open(osp.join(work_dir, 'epoch_2.pth'))
    assert got['not_plain'] == []
    assert got['keys'] == [
        'message_hub', 'meta', 'optimizer', 'param_schedulers', 'rng_state',
        'state_dict'
    ]
    assert len(got['loss_history']) == 4  # 2 iterations an epoch
    assert 'eta' in got['runtime_info']


def _assert_equal_trees(got, want, path='ck', skip=()):
    if path in skip:
        return
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want), path
    elif isinstance(want, dict):
        assert set(got) == set(want), path
        for k in want:
            _assert_equal_trees(got[k], want[k], f'{path}.{k}', skip)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_equal_trees(g, w, f'{path}[{i}]', skip)
    else:
        assert got == want, path


def test_resume_ends_with_the_uninterrupted_checkpoint(tiny_data, tmp_path):
    # no validation: MMEngine validates after writing the epoch's
    # checkpoint, so a resumed run never has the last validation's scalars
    full, part = str(tmp_path / 'full'), str(tmp_path / 'part')
    _train(full, tiny_data, max_epochs=3)
    _train(part, tiny_data, max_epochs=2)
    _train(part, tiny_data, max_epochs=3, resume=True)
    want = _load(osp.join(full, 'epoch_3.pth'))
    got = _load(osp.join(part, 'epoch_3.pth'))
    hub = 'ck.message_hub'
    timings = {
        f'{hub}.log_scalars.{k}'
        for k in want['message_hub']['log_scalars'] if k.endswith('time')
    }
    _assert_equal_trees(
        got,
        want,
        # what differs by design: work-dir paths and the resume flag (cfg,
        # last_ckpt), start times (experiment_name, time), timings, and the
        # git commit MMEngine appends to its version (a commit may land
        # between the runs)
        skip={
            'ck.meta.cfg', 'ck.meta.time', 'ck.meta.experiment_name',
            'ck.meta.mmengine_version', f'{hub}.runtime_info.mmengine_version',
            f'{hub}.runtime_info.cfg', f'{hub}.runtime_info.last_ckpt',
            f'{hub}.runtime_info.experiment_name', f'{hub}.runtime_info.eta',
            *timings
        })
    loss = want['message_hub']['log_scalars']['train/loss']
    # the resumed hub carries the first run's history: all 6 iterations
    assert loss['log_history']['shape'] == [6]
    assert np.isfinite(loss['log_history']['data'].numpy()).all()
