"""mmpe as a plugin: mmdet's and mmseg's installed ``tools/train.py`` and
``tools/test.py`` (what ``mim train`` / ``mim test`` run) on mmpe's
quick-start configs train one short epoch, resume for a second, test the
result, and write checkpoints that stock ``torch.load(weights_only=True)``
opens without mmpe; a user's config without mmpe's runtime, run through
mmpe's ``tools/train.py``, ends up with exactly one of each runtime piece.
"""
import os
import os.path as osp
import subprocess
import sys
from collections import Counter

import pytest
from mmengine.config import Config

import mmdet
import mmseg
from mmpe.datasets import generate_synthetic_seg

from test_plain_checkpoint_e2e import _stock_open
from test_train_test_e2e import (CONFIG, ROOT, _options,  # noqa: F401
                                 tiny_data)

pytestmark = pytest.mark.slow

MMDET_TOOLS = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools')
MMSEG_TOOLS = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools')
SEG_CONFIG = osp.join(ROOT, 'configs', 'quickstart',
                      'fpn_cpvt-tiny_synthetic-seg.py')
# the runtime pieces, written out here (not taken from mmpe)
HOOKS = ('DatasetCheckHook', 'PlainParamGroupsHook', 'RNGStateHook',
         'PreemptionHook', 'PlainCheckpointHook')
HANG_GUARD_S = 900


def _run(cmd, cwd):
    # the worktree's mmpe, whatever the venv has installed
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=f'{ROOT}:{os.environ.get("PYTHONPATH", "")}')
    proc = subprocess.run([sys.executable, *cmd], cwd=cwd, env=env,
                          capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f'{cmd[0]}: status {proc.returncode}\n' + \
        log[-6000:]
    return log


def _is_plain(path):
    opened = _stock_open(path)
    assert opened['not_plain'] == [], opened['not_plain']
    assert 'state_dict' in opened['keys']


def test_mmdet_tools_train_resume_test(tiny_data, tmp_path):
    assert osp.isfile(osp.join(MMDET_TOOLS, 'train.py'))
    work = str(tmp_path / 'work')
    train = [osp.join(MMDET_TOOLS, 'train.py'), CONFIG, '--work-dir', work]
    log = _run(train + ['--cfg-options', *_options(tiny_data, 1)], tmp_path)
    # the config's runner gave the guarantees
    assert 'ResumableEpochBasedTrainLoop in place of EpochBasedTrainLoop' \
        in log
    assert 'PreemptionHook: on SIGTERM, SIGUSR1' in log
    assert 'dataset check: no problems in the train set' in log
    _is_plain(osp.join(work, 'epoch_1.pth'))

    log = _run(train + ['--resume', '--cfg-options', *_options(tiny_data, 2)],
               tmp_path)
    assert f'continuing from {osp.join(work, "epoch_1.pth")}' in log
    assert 'resumed epoch: 1, iter: 2' in log
    ckpt = osp.join(work, 'epoch_2.pth')
    _is_plain(ckpt)

    log = _run([
        osp.join(MMDET_TOOLS, 'test.py'), CONFIG, ckpt, '--work-dir',
        str(tmp_path / 'test'), '--cfg-options', *_options(tiny_data, 2)
    ], tmp_path)
    assert 'coco/bbox_mAP' in log
    assert 'dataset check: no problems in the test set' in log


def test_mmseg_tools_train_resume_test(tmp_path):
    assert osp.isfile(osp.join(MMSEG_TOOLS, 'train.py'))
    data = str(tmp_path / 'data')
    generate_synthetic_seg(data, num_train=4, num_val=2, min_size=64,
                           max_size=96)
    opts = [f'{s}_dataloader.dataset.data_root={data}/'
            for s in ('train', 'val', 'test')]
    opts += ['train_cfg.val_interval=2', 'default_hooks.checkpoint.interval=2',
             'default_hooks.checkpoint.max_keep_ckpts=-1',
             'train_dataloader.batch_size=2', 'model.backbone.arch.depth=1']
    work = str(tmp_path / 'work')
    train = [osp.join(MMSEG_TOOLS, 'train.py'), SEG_CONFIG, '--work-dir', work]
    log = _run(train + ['--cfg-options', 'train_cfg.max_iters=2', *opts],
               tmp_path)
    assert 'AtomicCheckpointHook in place of CheckpointHook' in log
    _is_plain(osp.join(work, 'iter_2.pth'))

    log = _run(train + ['--resume', '--cfg-options', 'train_cfg.max_iters=4',
                        *opts], tmp_path)
    assert f'continuing from {osp.join(work, "iter_2.pth")}' in log
    ckpt = osp.join(work, 'iter_4.pth')
    _is_plain(ckpt)

    log = _run([
        osp.join(MMSEG_TOOLS, 'test.py'), SEG_CONFIG, ckpt, '--work-dir',
        str(tmp_path / 'test'), '--cfg-options', *opts
    ], tmp_path)
    assert 'mIoU' in log


def test_mmpe_tools_complete_a_config_without_the_runtime(tiny_data,
                                                         tmp_path):
    # a user's own config: the quick-start without runner_type and with its
    # own custom_hooks (one mmpe hook, spelled with its scope)
    mine = Config.fromfile(CONFIG).to_dict()
    mine.pop('runner_type')
    mine['custom_hooks'] = [
        dict(type='mmdet.PreemptionHook', signals=['SIGUSR1'])
    ]
    path = str(tmp_path / 'my_detr.py')
    Config(mine).dump(path)
    assert 'runner_type' not in open(path).read()

    work = str(tmp_path / 'work')
    log = _run([
        'tools/train.py', path, '--work-dir', work, '--cfg-options',
        *_options(tiny_data, 1)
    ], ROOT)
    lines = [ln for ln in log.splitlines() if 'mmpe runtime:' in ln]
    assert len(lines) == 1, lines  # one line says what was added
    assert 'PlainCheckpointHook' in lines[0]
    # the config the run used (MMEngine dumps it into the work dir)
    used = Config.fromfile(osp.join(work, 'my_detr.py'))
    names = Counter(h['type'].split('.')[-1] for h in used.custom_hooks)
    assert names == Counter(HOOKS), names
    assert used.runner_type == 'MMPERunner'
    assert used.default_hooks.checkpoint.type == 'AtomicCheckpointHook'
    assert used.train_cfg.type == 'ResumableEpochBasedTrainLoop'
    assert 'PreemptionHook: on SIGUSR1 a checkpoint' in log  # the user's own
    # a clean set passes with one summary line (train and val)
    checks = [ln for ln in log.splitlines() if 'dataset check' in ln]
    assert len(checks) == 1, checks
    assert 'no problems in the train set (8 samples' in checks[0]
    assert 'val set (4 samples' in checks[0]
    _is_plain(osp.join(work, 'epoch_1.pth'))
