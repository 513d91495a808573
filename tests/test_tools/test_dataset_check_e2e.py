"""The data set check's exit-status contract, end to end (subprocesses, CPU,
tiny generated sets with bad files the tests make):

* ``tools/train.py`` on a set with a truncated JPEG, a file that is not an
  image, a missing file, an image whose size differs from its annotation, a
  box outside its image, a zero-area box, an unknown category and a 2-point
  polygon exits with status 2 before any iteration, and its output names
  each file with its reason;
* with ``skip_bad_images=True`` the run trains and finishes, and the
  warning names the skipped files;
* ``tools/test.py`` checks the test set the same way.

Each reason is unit-tested in tests/test_datasets/test_data_check.py; here
one run covers all of them.
"""
import glob
import os
import os.path as osp
import subprocess
import sys

import pytest

from broken_coco import break_copy, coco_set  # noqa: F401 (fixture)
from test_train_test_e2e import CONFIG, ROOT, _options

pytestmark = pytest.mark.slow

INSTANCE_CONFIG = osp.join(ROOT, 'configs', 'quickstart',
                           'mask-rcnn_cpvt-tiny_synthetic.py')
HANG_GUARD_S = 900
# the words of each reason in the output (written here, not taken from
# mmpe): the file's name is asserted beside them
REASON_WORDS = {
    'truncated JPEG': 'JPEG cut off',
    'not an image': 'not an image file',
    'missing file': 'does not exist',
    'size differs from the annotation': 'differs from the annotation',
    'box outside the image': 'reaches outside the',
    'zero-size box': 'zero or negative width or height',
    'unknown category': 'is not among the file\'s categories',
    'polygon with fewer than 3 points': 'polygon 0 has 2 point(s)',
}


def _run(cmd, status):
    proc = subprocess.run([sys.executable, *cmd], cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS='1'),
                          capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    log = proc.stdout + proc.stderr
    assert proc.returncode == status, f'status {proc.returncode}\n' + \
        log[-6000:]
    return log


def _line_of(log, path):
    lines = [ln for ln in log.splitlines() if ln.strip().startswith(path)]
    assert lines, f'{path} not named at the start of a line:\n{log[-4000:]}'
    return lines


def test_bad_data_stops_training_before_the_first_iteration(
        coco_set, tmp_path):
    bad, want = break_copy(coco_set, tmp_path)
    work = str(tmp_path / 'work')
    log = _run([
        'tools/train.py', INSTANCE_CONFIG, '--work-dir', work,
        '--cfg-options', *_options(bad, 1)
    ], status=2)
    for path, ann_id, kind in want:
        lines = _line_of(log, path)
        where = f'{path} [annotation {ann_id}]: ' if ann_id is not None \
            else f'{path}: '
        assert any(ln.strip().startswith(where) and REASON_WORDS[kind] in ln
                   for ln in lines), (kind, lines)
    assert 'Epoch(train)' not in log and 'Traceback' not in log
    assert glob.glob(osp.join(work, '*.pth')) == []
    listing = open(osp.join(work, 'dataset_check_train.txt')).read()
    assert all(path in listing for path, _, _ in want)


def test_skip_bad_images_trains_on_and_names_them(coco_set, tmp_path):
    bad, want = break_copy(coco_set, tmp_path)
    work = str(tmp_path / 'work')
    log = _run([
        'tools/train.py', CONFIG, '--work-dir', work, '--cfg-options',
        *_options(bad, 1), 'custom_hooks.0.skip_bad_images=True'
    ], status=0)
    warning = log[log.index('skip_bad_images=True: leaving out'):]
    # a detector reads no polygons: the 2-point one is no problem for it
    skipped = [w for w in want if w[2] != 'polygon with fewer than 3 points']
    for path, _, kind in skipped:
        assert path in warning, path
    assert f'leaving out {len(skipped)} image(s)' in warning
    assert 'Epoch(train) [1]' in log
    assert osp.isfile(osp.join(work, 'epoch_1.pth'))
    assert 'dataset check: no problems in the val set' in log


def test_tools_test_checks_the_test_set(coco_set, tmp_path):
    work = str(tmp_path / 'work')
    _run(['tools/train.py', CONFIG, '--work-dir', work, '--cfg-options',
          *_options(coco_set, 1)], status=0)
    bad, want = break_copy(coco_set, tmp_path)
    # the test set of the quick-start is the val split: break one image
    val = sorted(glob.glob(osp.join(bad, 'val', '*.jpg')))[0]
    os.remove(val)
    log = _run([
        'tools/test.py', CONFIG, osp.join(work, 'epoch_1.pth'),
        '--work-dir', str(tmp_path / 'test'), '--cfg-options',
        *_options(bad, 1)
    ], status=2)
    assert any('does not exist' in ln for ln in _line_of(log, val))
    assert 'test set' in log and 'coco/bbox_mAP' not in log
