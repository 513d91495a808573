"""The synthetic set's semantic label maps: the COCO masks, pixel for pixel.

Expected values come from the COCO side: each image's annotations are
rasterised by pycocotools (as mmdet's ``poly2mask`` does) and painted with
their ``category_id``; the label maps must equal that painting. The COCO
files themselves must be those the plain generator writes, byte for byte.
"""
import filecmp
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pycocotools.mask as mask_utils
import pytest
from PIL import Image

from mmpe.datasets import (SYNTHETIC_COCO_CLASSES, SYNTHETIC_SEG_CLASSES,
                           generate_synthetic_coco, generate_synthetic_seg)

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
CLI = osp.join(ROOT, 'tools', 'dataset_converters', 'make_synthetic_seg.py')
TINY = dict(num_train=12, num_val=4, min_size=64, max_size=128)


@pytest.fixture(scope='module')
def sets(tmp_path_factory):
    """(COCO-only set, COCO + label maps set), same arguments."""
    coco = str(tmp_path_factory.mktemp('coco_only'))
    seg = str(tmp_path_factory.mktemp('coco_seg'))
    generate_synthetic_coco(coco, seed=3, **TINY)
    generate_synthetic_seg(seg, seed=3, **TINY)
    return coco, seg


def _coco_label_map(coco: dict, image: dict) -> np.ndarray:
    """Paint every annotation's pycocotools mask with its category id;
    asserts that no two annotations claim a pixel."""
    h, w = image['height'], image['width']
    painted = np.zeros((h, w), np.uint8)
    claimed = np.zeros((h, w), bool)
    for ann in coco['annotations']:
        if ann['image_id'] != image['id']:
            continue
        rle = mask_utils.merge(
            mask_utils.frPyObjects(ann['segmentation'], h, w))
        mask = mask_utils.decode(rle).astype(bool)
        assert not (claimed & mask).any()
        claimed |= mask
        painted[mask] = ann['category_id']
    return painted


@pytest.mark.parametrize('split', ['train', 'val'])
def test_label_maps_equal_the_coco_masks(sets, split):
    _, root = sets
    with open(osp.join(root, 'annotations', f'instances_{split}.json')) as f:
        coco = json.load(f)
    assert len(coco['images']) == TINY[f'num_{split}']
    seen = set()
    for image in coco['images']:
        name = osp.splitext(image['file_name'])[0] + '.png'
        with Image.open(osp.join(root, 'seg_maps', split, name)) as img:
            assert img.mode == 'L'
            label_map = np.array(img)
        want = _coco_label_map(coco, image)
        assert label_map.shape == (image['height'], image['width'])
        np.testing.assert_array_equal(label_map, want)
        seen |= set(np.unique(label_map).tolist())
    assert seen <= set(range(len(SYNTHETIC_SEG_CLASSES)))
    assert 0 in seen and len(seen) > 2


def test_classes_are_background_then_the_coco_categories(sets):
    _, root = sets
    with open(osp.join(root, 'annotations', 'instances_val.json')) as f:
        categories = json.load(f)['categories']
    assert SYNTHETIC_SEG_CLASSES[0] == 'background'
    for cat in categories:
        assert SYNTHETIC_SEG_CLASSES[cat['id']] == cat['name']
    assert SYNTHETIC_SEG_CLASSES[1:] == SYNTHETIC_COCO_CLASSES


def test_coco_files_are_byte_identical_to_the_plain_generator(sets):
    coco, seg = sets
    for rel in ('annotations/instances_train.json',
                'annotations/instances_val.json',
                'annotations/synthetic_coco_meta.json'):
        assert filecmp.cmp(osp.join(coco, rel), osp.join(seg, rel),
                           shallow=False), rel
    for split in ('train', 'val'):
        names = sorted(os.listdir(osp.join(coco, split)))
        assert names == sorted(os.listdir(osp.join(seg, split)))
        match, mismatch, errors = filecmp.cmpfiles(
            osp.join(coco, split), osp.join(seg, split), names,
            shallow=False)
        assert not mismatch and not errors


def test_rerun_writes_nothing_and_adding_maps_keeps_the_coco_set(sets,
                                                                 tmp_path):
    _, root = sets
    path = osp.join(root, 'seg_maps', 'val', '000000.png')
    before = os.stat(path).st_mtime_ns
    summary = generate_synthetic_seg(root, seed=3, **TINY)
    assert summary.skipped
    assert os.stat(path).st_mtime_ns == before
    # label maps for an existing COCO-only set: the COCO files stay
    coco_root = str(tmp_path / 'set')
    generate_synthetic_coco(coco_root, seed=3, **TINY)
    ann = osp.join(coco_root, 'annotations', 'instances_train.json')
    stamp = os.stat(ann).st_mtime_ns
    summary = generate_synthetic_seg(coco_root, seed=3, **TINY)
    assert not summary.skipped
    assert os.stat(ann).st_mtime_ns == stamp
    assert filecmp.cmp(path, osp.join(coco_root, 'seg_maps', 'val',
                                      '000000.png'), shallow=False)


def test_cli(tmp_path):
    out = str(tmp_path / 'cli')
    args = [sys.executable, CLI, '--out-dir', out, '--num-train', '2',
            '--num-val', '1', '--min-size', '64', '--max-size', '96']
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert osp.isfile(osp.join(out, 'seg_maps', 'train', '000001.png'))
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert 'nothing written' in proc.stdout
