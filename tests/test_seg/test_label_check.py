"""Bad label maps stop a run before its first step, naming the file and the
value: values beyond the classes (other than the ignore index), an image /
label size mismatch, a missing label file. ``SegLabelCheckHook`` is the data
set check (``DatasetCheckHook``) under its earlier name."""
import copy
import os
import os.path as osp
import shutil

import numpy as np
import pytest
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import DefaultScope
from mmengine.runner import Runner
from PIL import Image

from mmpe.datasets import generate_synthetic_seg
from mmpe.engine import DatasetCheckFailed, DatasetCheckHook
from mmpe.seg import SegLabelCheckHook, label_problems

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG = 'configs/quickstart/fpn_cpvt-tiny_synthetic-seg.py'


def _pair(tmp_path, label, img_hw=None, name='a'):
    h, w = img_hw or label.shape
    img = str(tmp_path / f'{name}.jpg')
    seg = str(tmp_path / f'{name}.png')
    Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(img)
    Image.fromarray(label.astype(np.uint8)).save(seg)
    return img, seg


def test_values_in_range_and_ignore_index_pass(tmp_path):
    label = np.zeros((8, 12), np.uint8)
    label[0, :5] = [0, 1, 2, 3, 4]
    label[1] = 255
    assert label_problems(*_pair(tmp_path, label), num_classes=5) == []


def test_value_beyond_the_classes_is_named_with_its_file(tmp_path):
    label = np.zeros((8, 12), np.uint8)
    label[3, 3], label[4, 4] = 5, 17
    img, seg = _pair(tmp_path, label)
    problems = label_problems(img, seg, num_classes=5)
    assert len(problems) == 1
    assert seg in problems[0] and '[5, 17]' in problems[0]
    assert '0..4' in problems[0] and 'ignore index 255' in problems[0]
    # a different ignore index makes 255 a bad value too
    label[0, 0] = 255
    img, seg = _pair(tmp_path, label, name='b')
    assert '[5, 17, 255]' in label_problems(img, seg, 5, ignore_index=254)[0]


def test_reduce_zero_label_is_applied_first(tmp_path):
    # ADE20K's raw maps: 0 = other (-> 255), 1..150 -> 0..149
    label = np.array([[0, 1, 150, 151]], np.uint8)
    img, seg = _pair(tmp_path, label)
    problems = label_problems(img, seg, 150, reduce_zero_label=True)
    assert len(problems) == 1
    assert '[150] after reduce_zero_label' in problems[0]


def test_size_mismatch_names_both_files_and_sizes(tmp_path):
    img, seg = _pair(tmp_path, np.zeros((8, 12), np.uint8), img_hw=(8, 10))
    problem, = label_problems(img, seg, num_classes=5)
    assert seg in problem and img in problem
    assert '12 x 8' in problem and '10 x 8' in problem


def test_missing_label_file_is_named(tmp_path):
    img, seg = _pair(tmp_path, np.zeros((8, 12), np.uint8))
    os.remove(seg)
    problem, = label_problems(img, seg, num_classes=5)
    assert seg in problem and 'does not exist' in problem


def test_hook_refuses_unknown_splits():
    with pytest.raises(ValueError,
                       match=r"'testing'.*\('train', 'val', 'test'\)"):
        SegLabelCheckHook(splits=('train', 'testing'))
    hook = SegLabelCheckHook(ignore_index=254)
    assert isinstance(hook, DatasetCheckHook)  # one mechanism
    assert hook.splits == ('train', 'val') and hook.ignore_index == 254


class CountSteps(Hook):

    def __init__(self):
        self.steps = 0

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.steps += 1


@pytest.fixture(scope='module')
def tiny_set(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('seg'))
    generate_synthetic_seg(root, num_train=4, num_val=2, min_size=64,
                           max_size=96)
    return root


@pytest.mark.parametrize('fault', ['value', 'size', 'missing'])
def test_runner_stops_before_the_first_step(tiny_set, tmp_path, fault):
    root = str(tmp_path / 'data')
    os.makedirs(root)
    for split in ('train', 'val'):  # the images, shared
        os.symlink(osp.join(tiny_set, split), osp.join(root, split))
    # a private copy of the label maps, to break one of them
    shutil.copytree(osp.join(tiny_set, 'seg_maps'),
                    osp.join(root, 'seg_maps'))
    bad = osp.join(root, 'seg_maps', 'train', '000002.png')
    label = np.array(Image.open(bad))
    if fault == 'value':
        label[0, 0] = 7
        Image.fromarray(label).save(bad)
        want = [bad, '[7]']
    elif fault == 'size':
        Image.fromarray(label[:-1]).save(bad)
        want = [bad, osp.join(root, 'train', '000002.jpg')]
    else:
        os.remove(bad)
        want = [bad, 'does not exist']

    cfg = Config.fromfile(osp.join(REPO, CONFIG))
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = root
    cfg.model.backbone.arch = dict(embed_dims=32, depth=1, num_heads=2,
                                  mlp_ratio=2.)
    cfg.model.neck.in_channels = 32
    cfg.train_cfg.max_iters = 2
    cfg.work_dir = str(tmp_path / 'work')
    cfg.default_hooks.pop('visualization')
    # the config's own list, with the hook under its earlier name
    cfg.custom_hooks = [dict(type='SegLabelCheckHook', cache_dir=None)]
    counter = CountSteps()
    with DefaultScope.overwrite_default_scope('mmseg'):
        runner = Runner.from_cfg(copy.deepcopy(cfg))
        runner.register_hook(counter)
        with pytest.raises(DatasetCheckFailed) as err:
            runner.train()
    assert err.value.code == 2  # the exit status, under any launcher
    msg = str(err.value)
    assert 'train set' in msg and '1 problem(s)' in msg
    assert all(w in msg for w in want), msg
    assert counter.steps == 0
