"""Tests of the embedded synthetic COCO-format data set generator."""
import contextlib
import io
import json
import os
import os.path as osp
import subprocess
import sys

import cv2
import numpy as np
import pycocotools.mask as mask_utils
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from mmpe.datasets import (SYNTHETIC_COCO_CLASSES, SYNTHETIC_COCO_METAINFO,
                           generate_synthetic_coco, mask_to_polygons,
                           render_synthetic_image)

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
CLI = osp.join(ROOT, 'tools', 'dataset_converters', 'make_synthetic_coco.py')
DET_CFG = osp.join(ROOT, 'configs/_base_/datasets/synthetic_coco_detection.py')
INS_CFG = osp.join(ROOT, 'configs/_base_/datasets/synthetic_coco_instance.py')
TINY = dict(num_train=24, num_val=6, min_size=64, max_size=128)


@pytest.fixture(scope='module')
def tiny_set(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp('synthetic_coco'))
    generate_synthetic_coco(root, seed=1, **TINY)
    return root


def _load(root: str, split: str = 'train') -> dict:
    with open(osp.join(root, 'annotations', f'instances_{split}.json')) as f:
        return json.load(f)


def _raster(segmentation: list, h: int, w: int) -> np.ndarray:
    """pycocotools' rasterisation of COCO polygons (as mmdet's poly2mask)."""
    rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, h, w))
    return mask_utils.decode(rle).astype(bool)


def _tight_box(mask: np.ndarray) -> np.ndarray:
    """[x, y, w, h] of the pixels of a non-empty (H, W) mask."""
    ys, xs = np.nonzero(mask)
    return np.array(
        [xs.min(),
         ys.min(),
         xs.max() - xs.min() + 1,
         ys.max() - ys.min() + 1],
        dtype=np.float64)


def _read_images(root: str, split: str) -> list:
    names = sorted(os.listdir(osp.join(root, split)))
    return [
        cv2.imread(osp.join(root, split, n), cv2.IMREAD_UNCHANGED)
        for n in names
    ]


# --------------------------------------------------------------- determinism


def test_same_seed_gives_identical_files_and_other_seed_differs(tmp_path):
    a, b, c = (str(tmp_path / n) for n in 'abc')
    generate_synthetic_coco(a, seed=7, num_train=8, num_val=3)
    generate_synthetic_coco(b, seed=7, num_train=8, num_val=3)
    generate_synthetic_coco(c, seed=8, num_train=8, num_val=3)
    for split in ('train', 'val'):
        name = f'annotations/instances_{split}.json'
        with open(osp.join(a, name),
                  'rb') as fa, open(osp.join(b, name), 'rb') as fb:
            assert fa.read() == fb.read()
        imgs_a, imgs_b = _read_images(a, split), _read_images(b, split)
        assert len(imgs_a) == len(imgs_b) > 0
        for ia, ib in zip(imgs_a, imgs_b):
            np.testing.assert_array_equal(ia, ib)
    assert _load(a)['annotations'] != _load(c)['annotations']


def test_images_do_not_depend_on_generation_order(tmp_path):
    """Image i has its own generator: a longer set starts the same."""
    short, long = str(tmp_path / 'short'), str(tmp_path / 'long')
    generate_synthetic_coco(short, seed=3, num_train=3, num_val=1)
    generate_synthetic_coco(long, seed=3, num_train=6, num_val=1)
    s, l = _load(short), _load(long)
    assert l['images'][:3] == s['images']
    assert [a for a in l['annotations']
            if a['image_id'] <= 3] == s['annotations']
    for ia, ib in zip(
            _read_images(short, 'train'),
            _read_images(long, 'train')[:3]):
        np.testing.assert_array_equal(ia, ib)
    # train and val differ although both start at index 0
    assert _load(long, 'val')['images'][0] != l['images'][0]


# ---------------------------------------------------------------- annotations


@pytest.mark.parametrize('split', ['train', 'val'])
def test_annotations_are_valid_coco(tiny_set, split):
    coco = _load(tiny_set, split)
    assert {'info', 'licenses', 'images', 'annotations',
            'categories'} <= set(coco)
    assert [(c['id'], c['name']) for c in coco['categories']
            ] == list(enumerate(SYNTHETIC_COCO_CLASSES, 1))
    images = {im['id']: im for im in coco['images']}
    assert len(images) == len(coco['images']) == TINY[f'num_{split}']
    for im in coco['images']:
        img = cv2.imread(osp.join(tiny_set, split, im['file_name']))
        assert img.shape == (im['height'], im['width'], 3)
    ann_ids = [a['id'] for a in coco['annotations']]
    assert len(set(ann_ids)) == len(ann_ids)
    assert len(coco['annotations']) >= len(images)  # at least one object each
    for ann in coco['annotations']:
        im = images[ann['image_id']]
        h, w = im['height'], im['width']
        assert ann['iscrowd'] == 0
        assert 1 <= ann['category_id'] <= len(SYNTHETIC_COCO_CLASSES)
        x, y, bw, bh = ann['bbox']
        assert 0 <= x and 0 <= y and bw > 0 and bh > 0
        assert x + bw <= w and y + bh <= h
        assert ann['segmentation'], ann['id']
        for poly in ann['segmentation']:
            assert len(poly) % 2 == 0 and len(poly) >= 6
        mask = _raster(ann['segmentation'], h, w)
        # The traced polygons rasterise back to the visible mask exactly, so
        # box and area agree to the pixel (1 px tolerance as the contract).
        np.testing.assert_allclose(_tight_box(mask), ann['bbox'], atol=1)
        assert abs(mask.sum() - ann['area']) <= 0.02 * ann['area']


def test_visible_masks_are_disjoint_and_cover_objects(tiny_set):
    """Occlusion is resolved: one image's visible masks never share a pixel."""
    coco = _load(tiny_set)
    images = {im['id']: im for im in coco['images']}
    by_image: dict = {}
    for ann in coco['annotations']:
        by_image.setdefault(ann['image_id'], []).append(ann)
    for image_id, anns in by_image.items():
        im = images[image_id]
        count = sum(
            _raster(a['segmentation'], im['height'], im['width']).astype(int)
            for a in anns)
        assert count.max() == 1


def test_objects_are_occluded_sometimes(tmp_path):
    """Annotations are in painting order; an object whose visible mask borders
    a later object's (masks are disjoint) has been painted over by it."""
    root = str(tmp_path / 'occ')
    generate_synthetic_coco(root, seed=0, num_train=60, num_val=1)
    coco = _load(root)
    images = {im['id']: im for im in coco['images']}
    by_image: dict = {}
    for ann in coco['annotations']:
        by_image.setdefault(ann['image_id'], []).append(ann)
    occluded = 0
    kernel = np.ones((3, 3), np.uint8)
    for image_id, anns in by_image.items():
        im = images[image_id]
        masks = [
            _raster(a['segmentation'], im['height'], im['width']) for a in anns
        ]
        for k, mask in enumerate(masks[:-1]):
            grown = cv2.dilate(mask.astype(np.uint8), kernel).astype(bool)
            if (grown & np.any(masks[k + 1:], axis=0)).sum() > 5:
                occluded += 1
    assert occluded >= 0.05 * len(coco['annotations'])


def test_image_sizes_and_aspect_ratios_vary(tmp_path):
    root = str(tmp_path / 'sizes')
    generate_synthetic_coco(
        root, seed=2, num_train=80, num_val=1, min_size=96, max_size=200)
    coco = _load(root)
    ws = np.array([im['width'] for im in coco['images']])
    hs = np.array([im['height'] for im in coco['images']])
    long_side, ratio = np.maximum(ws, hs), ws / hs
    assert long_side.min() >= 96 and long_side.max() <= 200
    # rounding the short side may move the ratio a little past 1:3 .. 3:1
    assert ratio.min() >= 1 / 3 * 0.97 and ratio.max() <= 3 * 1.03
    assert ratio.min() < 0.5 and ratio.max() > 2  # tall and wide both occur
    assert len(set(zip(ws, hs))) > 40


def test_render_respects_visibility_rules():
    rng = np.random.default_rng(0)
    for _ in range(30):
        img, objects = render_synthetic_image(rng, max_objects=4)
        assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
        assert 1 <= len(objects) <= 4
        union = np.zeros(img.shape[:2], dtype=int)
        for label, visible in objects:
            assert 0 <= label < len(SYNTHETIC_COCO_CLASSES)
            assert visible.shape == img.shape[:2] and visible.sum() >= 48
            union += visible
        assert union.max() == 1


def _object_hues(img: np.ndarray, visible: np.ndarray) -> float:
    """Circular mean hue in degrees of an object's pixels (OpenCV's HSV)."""
    hue = cv2.cvtColor(img, cv2.COLOR_BGR2HSV_FULL)[..., 0][visible]
    angle = hue.astype(np.float64) / 256 * 2 * np.pi
    return float(
        np.rad2deg(np.arctan2(np.sin(angle).mean(), np.cos(angle).mean())) %
        360)


def _hue_gap(a: float, b: float) -> float:
    return abs((a - b + 180) % 360 - 180)


def test_object_hue_random_keeps_the_masks_and_unties_hue_from_class():
    # expected hues: the class hues of the docs (red, blue, green, yellow),
    # measured back through OpenCV's HSV conversion
    class_hues = {'square': 0.0, 'disk': 220.0, 'triangle': 120.0,
                  'ring': 50.0}
    gaps = {'class': [], 'random': []}
    for index in range(40):
        renders = {
            hue: render_synthetic_image(
                np.random.default_rng(index), object_hue=hue)
            for hue in ('class', 'random')
        }
        (img_c, objs_c), (img_r, objs_r) = renders['class'], renders['random']
        assert len(objs_c) == len(objs_r)  # same draws: same layout
        for (label_c, vis_c), (label_r, vis_r) in zip(objs_c, objs_r):
            assert label_c == label_r and np.array_equal(vis_c, vis_r)
            expected = class_hues[SYNTHETIC_COCO_CLASSES[label_c]]
            gaps['class'].append(_hue_gap(_object_hues(img_c, vis_c),
                                          expected))
            gaps['random'].append(_hue_gap(_object_hues(img_r, vis_r),
                                           expected))
    # class hue: +-8 deg jitter, plus blur / JPEG-free rounding at the edges
    assert max(gaps['class']) < 12
    # random hue: uniform, so the gap to the class hue is ~uniform in 0..180
    assert np.mean(gaps['random']) > 60 and max(gaps['random']) > 150


def test_default_object_hue_is_not_recorded_so_older_sets_match(tmp_path):
    root = str(tmp_path / 'd')
    first = generate_synthetic_coco(root, seed=0, num_train=3, num_val=1)
    assert 'object_hue' not in first.params  # as written before the field
    with pytest.raises(FileExistsError, match='different parameters'):
        generate_synthetic_coco(
            root, seed=0, num_train=3, num_val=1, object_hue='random')
    other = generate_synthetic_coco(
        str(tmp_path / 'r'), seed=0, num_train=3, num_val=1,
        object_hue='random')
    assert other.params['object_hue'] == 'random'


# -------------------------------------------------------------------- canvas
# The documented drawing (mmpe/datasets/synthetic_image.py and
# synthetic_shapes.py): an object's extent (side / diameter) is uniform in
# [max(0.3 s, 24), max(0.7 s, 24)] px of the *base* short side s (the
# image's short side / canvas); the widest shape's box is 1.36 extents (a
# 1.25:1 rectangle of side `extent` turned by 20 deg: sqrt(1.25) cos 20 +
# sin 20 / sqrt(1.25) = 1.357; a triangle of radii 0.66 extent: 1.32; an
# ellipse: sqrt(1.15) = 1.07); the object count is uniform in
# 1..round(c^2 (max_objects + 1)) - 1.
WIDEST_BOX = 1.36


def _boxes_and_counts(root):
    coco = _load(root, 'val')
    shorts = {im['id']: min(im['height'], im['width'])
              for im in coco['images']}
    sides = np.array([max(a['bbox'][2:]) for a in coco['annotations']])
    shorts_per_box = np.array([shorts[a['image_id']]
                               for a in coco['annotations']])
    counts = np.bincount([a['image_id'] for a in coco['annotations']],
                         minlength=len(shorts) + 1)[1:]
    return coco, sides, shorts_per_box, counts


def test_canvas_keeps_object_scale_on_larger_images(tmp_path):
    """canvas=2: images twice as large per side, object boxes the same
    size in pixels (bounded by the base size, equal in distribution to the
    x1 set's), about four times as many objects per image; a resized set
    would double the boxes instead."""
    sets = {}
    for canvas in (1, 2):
        root = str(tmp_path / f'c{canvas}')
        generate_synthetic_coco(root, num_train=0, num_val=80, seed=4,
                                canvas=canvas)
        sets[canvas] = _boxes_and_counts(root)
    (coco1, sides1, _, counts1) = sets[1]
    (coco2, sides2, shorts2, counts2) = sets[2]
    longs = np.array([max(im['height'], im['width'])
                      for im in coco2['images']])
    # base long side 128..256 px, sides times 2 (rounded)
    assert longs.min() >= 2 * 128 and longs.max() <= 2 * 256
    assert longs.mean() > 1.8 * np.mean(
        [max(im['height'], im['width']) for im in coco1['images']])
    # every box fits the widest shape of the largest extent of the base
    # short side (short / 2), with a pixel of rounding
    bound = WIDEST_BOX * np.maximum(0.7 * (shorts2 / 2 + 0.5), 24) + 1
    assert (sides2 <= bound).all()
    # the same sizes in pixels as the x1 set: equal quartiles within the
    # sampling noise of ~200 / ~600 boxes (a resize would double them)
    for q in (25, 50, 75):
        ratio = np.percentile(sides2, q) / np.percentile(sides1, q)
        assert 0.85 < ratio < 1.15, (q, ratio)
    # four times the area, about four times the objects (placements that
    # would hide others are dropped, so a little fewer)
    assert counts2.max() <= 15 and counts1.max() <= 3
    assert 3.2 < counts2.mean() / counts1.mean() < 4.8


def test_canvas_one_is_not_recorded_and_bad_canvas_is_refused(tmp_path):
    root = str(tmp_path / 'd')
    first = generate_synthetic_coco(root, seed=0, num_train=3, num_val=1)
    assert 'canvas' not in first.params  # as written before the option
    assert generate_synthetic_coco(
        root, seed=0, num_train=3, num_val=1, canvas=1.0).skipped
    other = generate_synthetic_coco(
        str(tmp_path / 'c'), seed=0, num_train=0, num_val=1, canvas=1.5)
    assert other.params['canvas'] == 1.5
    for bad in (0.5, 0, True, '2', 17):
        with pytest.raises(ValueError, match=r'`canvas`.*\[1, 16\]'):
            generate_synthetic_coco(str(tmp_path / 'x'), canvas=bad)
    assert not osp.exists(tmp_path / 'x')


# ---------------------------------------------------------- mask_to_polygons


def _random_mask(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    mask = np.zeros((h, w), np.uint8)
    for _ in range(3):
        centre = (int(rng.integers(w)), int(rng.integers(h)))
        cv2.circle(mask, centre, int(rng.integers(2, 20)), 1, -1)
    cv2.fillPoly(mask, [rng.integers(0, [w, h], size=(3, 2)).astype(np.int32)],
                 1)
    for _ in range(2):  # holes
        centre = (int(rng.integers(w)), int(rng.integers(h)))
        cv2.circle(mask, centre, int(rng.integers(1, 8)), 0, -1)
    return mask.astype(bool)


@pytest.mark.parametrize('seed', range(4))
def test_mask_to_polygons_rasterises_back_exactly(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        mask = _random_mask(rng, 50, 70)
        if not mask.any():
            continue
        np.testing.assert_array_equal(
            _raster(mask_to_polygons(mask), 50, 70), mask)


@pytest.mark.parametrize('name', ['pixel', 'line', 'ring', 'corner', 'two'])
def test_mask_to_polygons_special_cases(name):
    mask = np.zeros((20, 30), bool)
    if name == 'pixel':
        mask[5, 7] = True
    elif name == 'line':
        mask[3, 2:25] = True
        mask[3:15, 24] = True
    elif name == 'ring':
        mask[2:18, 2:18] = True
        mask[6:14, 6:14] = False
    elif name == 'corner':  # touches the image border
        mask[:6, -6:] = True
    else:
        mask[1:4, 1:4] = mask[10:15, 20:29] = True
    polygons = mask_to_polygons(mask)
    assert all(len(p) >= 6 and len(p) % 2 == 0 for p in polygons)
    np.testing.assert_array_equal(_raster(polygons, 20, 30), mask)
    assert mask_to_polygons(np.zeros((4, 4), bool)) == []


# -------------------------------------------------------------------- COCOeval


@pytest.mark.parametrize('iou_type', ['bbox', 'segm'])
def test_cocoeval_of_ground_truth_gives_ap_1(tiny_set, iou_type):
    ann_file = osp.join(tiny_set, 'annotations', 'instances_val.json')
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(ann_file)
        dets = []
        for ann in gt.dataset['annotations']:
            det = dict(
                image_id=ann['image_id'],
                category_id=ann['category_id'],
                score=1.0)
            if iou_type == 'bbox':
                det['bbox'] = ann['bbox']
            else:
                rle = gt.annToRLE(ann)
                rle['counts'] = rle['counts'].decode()
                det['segmentation'] = rle
            dets.append(det)
        evaluator = COCOeval(gt, gt.loadRes(dets), iou_type)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    assert evaluator.stats[0] == pytest.approx(1.0)  # AP@[.5:.95]
    assert evaluator.stats[1] == pytest.approx(1.0)  # AP50


# ----------------------------------------------------------- no overwriting


def test_rerun_with_same_parameters_is_a_no_op(tmp_path):
    root = str(tmp_path / 'd')
    first = generate_synthetic_coco(root, seed=0, num_train=4, num_val=2)
    assert not first.skipped and first.num_images == {'train': 4, 'val': 2}
    ann = osp.join(root, 'annotations', 'instances_train.json')
    stamp = os.stat(ann).st_mtime_ns
    again = generate_synthetic_coco(root, seed=0, num_train=4, num_val=2)
    assert again.skipped and again.num_instances == first.num_instances
    assert os.stat(ann).st_mtime_ns == stamp


def test_refuses_to_overwrite_different_data_unless_asked(tmp_path):
    root = str(tmp_path / 'd')
    generate_synthetic_coco(root, seed=0, num_train=6, num_val=2)
    with pytest.raises(FileExistsError, match='--overwrite') as info:
        generate_synthetic_coco(root, seed=1, num_train=3, num_val=2)
    assert 'instances_train.json' in str(info.value)
    summary = generate_synthetic_coco(
        root, seed=1, num_train=3, num_val=2, overwrite=True)
    assert not summary.skipped
    assert sorted(os.listdir(osp.join(root, 'train'))) == [
        '000000.jpg', '000001.jpg', '000002.jpg'
    ]  # stale images of the old set are gone
    assert len(_load(root)['images']) == 3


@pytest.mark.parametrize('foreign', ['annotations', 'images'])
def test_refuses_data_it_did_not_write(tmp_path, foreign):
    root = tmp_path / 'user'
    if foreign == 'annotations':
        (root / 'annotations').mkdir(parents=True)
        path = root / 'annotations' / 'instances_val.json'
        path.write_text('{"mine": true}')
    else:
        (root / 'train').mkdir(parents=True)
        path = root / 'train' / '000000.jpg'
        path.write_bytes(b'not generated')
    with pytest.raises(FileExistsError, match='--overwrite'):
        generate_synthetic_coco(str(root), num_train=2, num_val=1)
    assert path.read_bytes() in (b'{"mine": true}', b'not generated')


@pytest.mark.parametrize('kwargs, field', [
    (dict(num_train=-1), 'num_train'),
    (dict(min_size=200, max_size=100), 'min_size'),
    (dict(aspect_range=(2.0, 1.0)), 'aspect_range'),
    (dict(max_objects=0), 'max_objects'),
    (dict(object_scale_range=(0.5, 1.5)), 'object_scale_range'),
    (dict(img_format='gif'), 'img_format'),
    (dict(object_hue='rainbow'), 'object_hue'),
])
def test_invalid_arguments_raise_value_error(tmp_path, kwargs, field):
    with pytest.raises(ValueError, match=field):
        generate_synthetic_coco(str(tmp_path / 'x'), **kwargs)
    assert not osp.exists(tmp_path / 'x')


# ------------------------------------------------------------------------ CLI


def test_cli_writes_skips_and_refuses(tmp_path):
    out = str(tmp_path / 'cli')
    env = dict(os.environ, OMP_NUM_THREADS='1')
    cmd = [
        sys.executable, CLI, '--out-dir', out, '--num-train', '3', '--num-val',
        '2', '--min-size', '64', '--max-size', '96', '--max-objects', '2',
        '--seed', '4'
    ]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert 'wrote' in proc.stdout and 'took' in proc.stdout
    coco = _load(out)
    assert len(coco['images']) == 3
    assert all(max(im['width'], im['height']) <= 96 for im in coco['images'])
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and 'already generated' in proc.stdout
    proc = subprocess.run(
        cmd[:-1] + ['5'],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300)
    assert proc.returncode == 2
    assert '--overwrite' in proc.stderr and 'Traceback' not in proc.stderr


# ------------------------------------------------------------ mmdet loading


def _dataset_cfg(cfg_path: str, root: str, split: str = 'train'):
    from mmengine.config import Config
    cfg = Config.fromfile(cfg_path)
    loader = cfg.train_dataloader if split == 'train' else cfg.val_dataloader
    loader.dataset.data_root = root + '/'
    return cfg, loader


def test_base_configs_match_the_generator():
    from mmengine.config import Config
    for path in (DET_CFG, INS_CFG):
        cfg = Config.fromfile(path)
        for loader in (cfg.train_dataloader, cfg.val_dataloader):
            assert tuple(loader.dataset.metainfo['classes']) == tuple(
                SYNTHETIC_COCO_METAINFO['classes'])
            assert [tuple(c) for c in loader.dataset.metainfo['palette']] == [
                tuple(c) for c in SYNTHETIC_COCO_METAINFO['palette']
            ]
        assert cfg.data_root == 'data/synthetic_coco/'
        assert cfg.train_dataloader.dataset.ann_file == \
            'annotations/instances_train.json'
        assert cfg.train_dataloader.dataset.data_prefix == dict(img='train/')


@pytest.mark.parametrize('cfg_path, with_mask', [(DET_CFG, False),
                                                 (INS_CFG, True)])
def test_mmdet_coco_dataset_loads_it(tiny_set, cfg_path, with_mask):
    from mmdet.registry import DATASETS
    from mmdet.structures.bbox import HorizontalBoxes
    _, loader = _dataset_cfg(cfg_path, tiny_set)
    dataset = DATASETS.build(loader.dataset)
    assert len(dataset) == TINY['num_train']  # every image has objects
    assert dataset.metainfo['classes'] == SYNTHETIC_COCO_CLASSES
    for idx in range(4):
        packed = dataset[idx]
        img, sample = packed['inputs'], packed['data_samples']
        assert img.dtype.is_floating_point is False and img.shape[0] == 3
        gt = sample.gt_instances
        boxes = gt.bboxes.tensor if isinstance(gt.bboxes, HorizontalBoxes) \
            else gt.bboxes
        assert len(boxes) >= 1
        assert ((gt.labels >= 0) & (gt.labels < 4)).all()
        h, w = img.shape[1:]
        assert (boxes[:, 0] >= 0).all() and (boxes[:, 2] <= w).all()
        assert (boxes[:, 1] >= 0).all() and (boxes[:, 3] <= h).all()
        assert ('masks' in gt) == with_mask
        if with_mask:
            masks = gt.masks.to_ndarray()  # (num_gt, H, W), after any flip
            assert masks.shape == (len(boxes), h, w)
            for mask, box in zip(masks, boxes.numpy()):
                x, y, bw, bh = _tight_box(mask.astype(bool))
                np.testing.assert_allclose([x, y, x + bw, y + bh], box, atol=1)


def test_dataloader_with_num_workers_0(tiny_set):
    """The base config's loader builds and batches with the usual CPU override
    ``num_workers=0`` (which needs ``persistent_workers=False`` in torch)."""
    from mmengine.runner import Runner
    _, loader = _dataset_cfg(INS_CFG, tiny_set)
    loader.num_workers = 0
    loader.persistent_workers = False
    loader.batch_size = 4
    data_loader = Runner.build_dataloader(loader.to_dict(), seed=0)
    batch = next(iter(data_loader))
    assert len(batch['inputs']) == 4 and len(batch['data_samples']) == 4
