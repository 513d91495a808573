"""The data set check, in process: each kind of bad file or annotation is
made here and found with its file, annotation id and reason; the answers
come from outside the checker (OpenCV and PIL decode the files, the
annotation values are the ones the test wrote, bash runs the repair command
the message gives); the cache reads again only what changed."""
import copy
import json
import os
import os.path as osp
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pycocotools.mask as mask_utils
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DATASETS
from PIL import Image

from mmpe.datasets import generate_synthetic_coco
from mmpe.datasets.data_check import (CheckOptions, ImageReadSettings,
                                      Problem, check_coco, check_dataset,
                                      check_image_file, format_report)
from mmpe.engine import DatasetCheckHook

from broken_coco import break_copy, coco_set  # noqa: F401 (fixture)

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
INS_CFG = osp.join(ROOT, 'configs/_base_/datasets/synthetic_coco_instance.py')
CLASSES = ('square', 'disk', 'triangle', 'ring')
CV2 = ImageReadSettings()  # mmcv's LoadImageFromFile defaults


def _decodes(path):
    """OpenCV on the file's bytes, as mmcv's LoadImageFromFile decodes
    (``cv2.imread`` of the path is more lenient with a missing end marker)."""
    data = np.frombuffer(open(path, 'rb').read(), np.uint8)
    return cv2.imdecode(data, cv2.IMREAD_COLOR) is not None


def _jpeg(path, h=40, w=60, seed=0, **save):
    rng = np.random.default_rng(seed)
    img = cv2.GaussianBlur((rng.random((h, w, 3)) * 255).astype(np.uint8),
                           (0, 0), 2)
    Image.fromarray(img).save(path, 'JPEG', quality=90, **save)
    return path


# ------------------------------------------------------------------ files


def test_a_good_image_gives_its_decoded_size(tmp_path):
    path = _jpeg(str(tmp_path / 'a.jpg'), h=40, w=60)
    assert check_image_file(path, CV2) == dict(shape=[40, 60])
    png = str(tmp_path / 'b.png')
    cv2.imwrite(png, np.zeros((7, 9), np.uint8))
    assert check_image_file(png, CV2) == dict(shape=[7, 9])


def test_missing_empty_and_non_image_files(tmp_path):
    missing = check_image_file(str(tmp_path / 'none.jpg'), CV2)
    assert missing['kind'] == 'missing file'
    (tmp_path / 'empty.jpg').write_bytes(b'')
    assert 'empty' in check_image_file(str(tmp_path / 'empty.jpg'),
                                       CV2)['reason']
    (tmp_path / 'text.jpg').write_text('<html>not found</html>')
    text = check_image_file(str(tmp_path / 'text.jpg'), CV2)
    assert text['kind'] == 'not an image' and "b'<html>no'" in text['reason']
    # a PNG signature, then garbage: an image that does not decode
    (tmp_path / 'bad.png').write_bytes(b'\x89PNG\r\n\x1a\n' + b'\0' * 50)
    assert check_image_file(str(tmp_path / 'bad.png'),
                            CV2)['kind'] == 'corrupt image'


@pytest.mark.parametrize('progressive', [False, True])
def test_jpeg_lacking_only_its_end_marker_and_the_repair(tmp_path,
                                                         progressive):
    path = _jpeg(str(tmp_path / 'cut.jpg'), progressive=progressive)
    whole = open(path, 'rb').read()
    assert whole[-2:] == b'\xff\xd9'
    with open(path, 'wb') as f:
        f.write(whole[:-2])
    assert not _decodes(path)  # what fails training (mmcv's assert)
    found = check_image_file(path, CV2)
    assert found['kind'] == 'JPEG lacks its end marker'
    command = found['reason'].split('appends the 2 missing bytes): ')[1]
    # the user's choice: run the command the message gives
    subprocess.run(['bash', '-c', command], check=True)
    assert open(path, 'rb').read() == whole
    assert _decodes(path)


def test_jpeg_cut_in_its_image_data(tmp_path):
    path = _jpeg(str(tmp_path / 'cut.jpg'), h=120, w=160)
    whole = open(path, 'rb').read()
    with open(path, 'wb') as f:
        f.write(whole[:len(whole) // 2])
    found = check_image_file(path, CV2)
    assert found['kind'] == 'truncated JPEG'
    assert 'printf' not in found['reason']  # appending would not repair it


def test_settings_come_from_the_pipeline():
    cfg = Config.fromfile(INS_CFG)
    settings = ImageReadSettings.from_pipeline(cfg.train_pipeline)
    assert settings.found and (settings.color_type, settings.imdecode_backend
                               ) == ('color', 'cv2')
    gray = ImageReadSettings.from_pipeline(
        [dict(type='LoadImageFromFile', color_type='grayscale',
              imdecode_backend='pillow')])
    assert (gray.color_type, gray.imdecode_backend) == ('grayscale', 'pillow')
    assert not ImageReadSettings.from_pipeline([dict(type='Resize')]).found


# ----------------------------------------------------------- annotations


def _coco(width=50, height=40, **ann):
    base = dict(id=7, image_id=1, category_id=2, bbox=[5.0, 5.0, 10.0, 8.0],
                area=80.0, iscrowd=0,
                segmentation=[[5.0, 5.0, 15.0, 5.0, 15.0, 13.0]])
    base.update(ann)
    return dict(
        images=[dict(id=1, file_name='a.jpg', width=width, height=height)],
        annotations=[base],
        categories=[dict(id=i + 1, name=n) for i, n in enumerate(CLASSES)])


def _problems(coco, classes=CLASSES, index_of=None):
    _, problems, notes = check_coco(coco, 'ann.json', classes, 'img/',
                                    {1: 0} if index_of is None else index_of)
    return problems, notes


def test_a_good_annotation_passes():
    assert _problems(_coco()) == ([], [])
    long_polygon = [[5.0 + (i % 7), 5.0 + i % 5] for i in range(40)]
    flat = [v for point in long_polygon for v in point]
    assert _problems(_coco(segmentation=[flat]))[0] == []
    # a box touching the image border within a pixel passes
    assert _problems(_coco(bbox=[-0.5, 0.0, 50.5, 40.9]))[0] == []


@pytest.mark.parametrize('ann, kind, words', [
    (dict(bbox=[45.0, 5.0, 10.0, 8.0]), 'box outside the image',
     ['[45.0, 5.0, 10.0, 8.0]', '50 x 40']),
    (dict(bbox=[5.0, 5.0, 0.0, 8.0], area=0.0), 'zero-size box',
     ['[5.0, 5.0, 0.0, 8.0]']),
    (dict(bbox=[5.0, 5.0, 10.0, -1.0]), 'zero-size box', ['-1.0']),
    (dict(area=0), 'zero-size box', ['area 0']),
    (dict(category_id=9), 'unknown category', ['9', '[1, 2, 3, 4]']),
    (dict(segmentation=[[5.0, 5.0, 15.0, 5.0]]),
     'polygon with fewer than 3 points', ['2 point(s)']),
    (dict(segmentation=[[5.0, 5.0, 15.0, 5.0, 15.0]]), 'bad polygon',
     ['odd']),
    (dict(bbox=[5.0, float('nan'), 10.0, 8.0]), 'NaN or inf', ['bbox']),
    (dict(segmentation=[[5.0, 5.0, 15.0, float('inf'), 15.0, 13.0]]),
     'NaN or inf', ['polygon 0']),
    (dict(area=float('inf')), 'NaN or inf', ['area']),
    # one value in a long polygon that is no finite number (JSON's NaN,
    # null, a string, true)
    (dict(segmentation=[[5.0, 5.0] * 19 + [15.0, float('nan')]]),
     'NaN or inf', ['polygon 0']),
    (dict(segmentation=[[5.0, 5.0] * 19 + [15.0, None]]), 'NaN or inf',
     ['polygon 0']),
    (dict(segmentation=[[5.0, 5.0] * 19 + [15.0, '13']]), 'NaN or inf',
     ['polygon 0']),
    (dict(segmentation=[[5.0, 5.0] * 19 + [15.0, True]]), 'NaN or inf',
     ['polygon 0']),
    (dict(bbox=[5.0, 5.0, True, 8.0]), 'NaN or inf', ['bbox']),
    (dict(segmentation=dict(size=[40, 51], counts='abc')), 'bad RLE mask',
     ['[40, 51]']),
    (dict(segmentation=dict(size=[40, 50], counts=[5, 3, 2])),
     'bad RLE mask', ['cover 10 pixels', '2000']),
    (dict(segmentation=dict(size=[40, 50], counts=[2000, -3, 3])),
     'bad RLE mask', ['non-negative']),
])
def test_each_bad_annotation_is_named(ann, kind, words):
    problems, _ = _problems(_coco(**ann))
    assert [p.kind for p in problems] == [kind], problems
    p = problems[0]
    assert (p.file, p.ann_id, p.index) == ('img/a.jpg', 7, 0)
    line = p.line()
    assert line.startswith('img/a.jpg [annotation 7]: ')
    assert all(w in line for w in words), line


def test_rle_masks_that_decode_pass():
    mask = np.zeros((40, 50), np.uint8, order='F')
    mask[5:13, 5:15] = 1
    rle = mask_utils.encode(mask)
    rle['counts'] = rle['counts'].decode()  # as in a JSON file
    assert _problems(_coco(segmentation=rle, iscrowd=1))[0] == []
    # uncompressed counts (COCO's crowd format), run lengths from numpy
    assert _problems(_coco(segmentation=dict(size=[40, 50],
                                             counts=_runs(mask))))[0] == []


def _runs(mask):
    """Run lengths of a mask in column-major order, from 0s (COCO's RLE)."""
    flat = mask.flatten(order='F')
    edges = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], edges, [flat.size]])).tolist()
    return runs if flat[0] == 0 else [0] + runs


def test_compressed_rle_counts_are_read_as_pycocotools_writes_them():
    from mmpe.datasets.data_check.coco_annotations import rle_counts
    rng = np.random.default_rng(0)
    for _ in range(20):
        mask = (rng.random((int(rng.integers(1, 60)), int(
            rng.integers(1, 60)))) < rng.random()).astype(np.uint8)
        rle = mask_utils.encode(np.asfortranarray(mask))
        assert rle_counts(rle['counts'].decode()) == _runs(mask)
    # a mask of another size under this size: counts that do not cover it
    mask = np.asfortranarray(np.ones((40, 60), np.uint8))
    rle = mask_utils.encode(mask)
    rle = dict(size=[40, 50], counts=rle['counts'].decode())
    problems, _ = _problems(_coco(segmentation=rle, iscrowd=1))
    assert 'cover 2400 pixels' in problems[0].reason


def test_masks_are_checked_only_when_the_pipeline_loads_them():
    from mmpe.datasets.data_check.image_files import loads_masks
    det = Config.fromfile(INS_CFG.replace('instance', 'detection'))
    assert not loads_masks(det.train_pipeline)
    assert loads_masks(Config.fromfile(INS_CFG).train_pipeline)
    coco = _coco(segmentation=[[5.0, 5.0, 15.0, 5.0]])
    _, problems, _ = check_coco(coco, 'a.json', CLASSES, 'img/', {1: 0},
                                with_masks=False)
    assert problems == []  # a detector never reads the polygon


def test_categories_and_classes():
    # the config trains on 3 of the 4 categories: mmdet's documented way
    problems, notes = _problems(_coco(category_id=4), classes=CLASSES[:3])
    assert problems == [] and '1 annotation(s)' in notes[0]
    # a class the file does not define shifts mmdet's labels: the whole set
    problems, _ = _problems(_coco(), classes=CLASSES + ('star', ))
    assert [p.kind for p in problems] == [
        'class missing from the annotation file'
    ]
    assert problems[0].whole_set and "['star']" in problems[0].reason


def test_bad_image_record_and_excluded_images():
    problems, _ = _problems(_coco(width=0))
    assert [p.kind for p in problems] == ['bad image size in the annotations']
    # an image the data set leaves out (filter_empty_gt): no index
    problems, _ = _problems(_coco(category_id=9), index_of={})
    assert problems[0].index is None


def test_report_lists_the_first_and_counts_all():
    problems = [Problem(f'f{i}.jpg', 'r', 'missing file') for i in range(4)]
    problems.append(Problem('g.jpg', 'x', 'zero-size box', ann_id=3))
    lines = format_report(problems, 2)
    assert lines == ['  f0.jpg: r', '  f1.jpg: r', '  ... and 3 more',
                     '  by reason: 4 missing file, 1 zero-size box']
    assert format_report(problems[:1], 2) == ['  f0.jpg: r']


# ------------------------------------------------------ a built data set


def _dataset(root):
    cfg = Config.fromfile(INS_CFG)
    ds = copy.deepcopy(cfg.train_dataloader.dataset)
    ds.data_root = root + '/'
    return DATASETS.build(ds)


@pytest.mark.parametrize('workers', [0, 2])
def test_every_problem_of_a_data_set_at_once(coco_set, tmp_path, workers):
    bad, want = break_copy(coco_set, tmp_path)
    dataset = _dataset(bad)
    result = check_dataset(dataset, 'train set',
                           CheckOptions(num_workers=workers, cache_dir=None))
    got = sorted((p.file, p.ann_id, p.kind) for p in result.problems)
    assert got == sorted(want)
    # each problem names the sample of the data set it spoils
    paths = [dataset.get_data_info(i)['img_path']
             for i in range(len(dataset))]
    for p in result.problems:
        assert p.index is not None and paths[p.index] == p.file
    assert result.num_samples == 10 and result.num_files == 10


def test_a_clean_set_and_the_cache(coco_set, tmp_path):
    root = str(tmp_path / 'copy')
    shutil.copytree(coco_set, root)
    options = CheckOptions(cache_dir=str(tmp_path / 'cache'))
    first = check_dataset(_dataset(root), 'train set', options)
    assert first.problems == [] and first.num_read == first.num_files == 10
    second = check_dataset(_dataset(root), 'train set', options)
    assert second.problems == [] and second.num_read == 0  # all cached
    # a changed file (new size and time) is read again, and only it
    path = osp.join(root, 'train', '000004.jpg')
    data = open(path, 'rb').read()
    with open(path, 'wb') as f:
        f.write(data[:-2])
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third = check_dataset(_dataset(root), 'train set', options)
    assert third.num_read == 1
    assert [(p.file, p.kind) for p in third.problems] == [
        (path, 'JPEG lacks its end marker')
    ]
    # the annotation file's check is cached too: a changed file is read
    ann_file = osp.join(root, 'annotations', 'instances_train.json')
    with open(ann_file) as f:
        coco = json.load(f)
    # on an image with other annotations, so that the data set keeps it
    image_ids = [a['image_id'] for a in coco['annotations']]
    ann = next(a for a in coco['annotations']
               if image_ids.count(a['image_id']) > 1)
    ann['category_id'] = 77
    with open(ann_file, 'w') as f:
        json.dump(coco, f)
    fourth = check_dataset(_dataset(root), 'train set', options)
    fifth = check_dataset(_dataset(root), 'train set', options)  # cached
    dataset = _dataset(root)
    paths = [dataset.get_data_info(i)['img_path']
             for i in range(len(dataset))]
    for result in (fourth, fifth):
        assert 'unknown category' in [p.kind for p in result.problems]
        # also a problem from the cache names the sample it spoils (mmdet's
        # parsed sample of that index reads the file)
        for p in result.problems:
            assert p.index is not None and paths[p.index] == p.file
    assert fifth.num_read == 0


@pytest.mark.parametrize('workers', [0, 2])
def test_reading_leaves_the_global_generators_alone(coco_set, tmp_path,
                                                    workers):
    """A check that reads files (cold cache) and one that reads none (warm
    cache) leave torch's default generator where they found it: the hook
    runs before training, so otherwise a resumed run (warm cache) would
    continue another random stream than the uninterrupted one."""
    options = CheckOptions(cache_dir=str(tmp_path / 'cache'),
                           num_workers=workers)
    for expect_read in (10, 0):
        torch.manual_seed(0)
        before = torch.get_rng_state()
        result = check_dataset(_dataset(coco_set), 'train set', options)
        assert result.num_read == expect_read
        assert torch.equal(torch.get_rng_state(), before)


def test_progress_in_a_log_is_a_line_at_every_tenth(coco_set, monkeypatch):
    from mmpe.datasets.data_check import file_reads
    lines = []
    monkeypatch.setattr(file_reads, 'print_log',
                        lambda msg, **kwargs: lines.append(msg))
    monkeypatch.setattr(file_reads, 'PROGRESS_MIN_FILES', 1)
    monkeypatch.setattr(file_reads, 'FILES_PER_BATCH', 1)
    monkeypatch.setattr(sys.stdout, 'isatty', lambda: False)  # a log file
    result = check_dataset(_dataset(coco_set), 'train set',
                           CheckOptions(cache_dir=None))
    assert result.num_read == 10
    # 10 files read one by one: a line after each, counting up to 10
    counts = [line.split(' files read')[0].split(': ')[1] for line in lines]
    assert counts == [f'{k}/10' for k in range(1, 11)]
    assert all('files/s' in line for line in lines)


def test_image_turned_by_exif_orientation(tmp_path):
    root = str(tmp_path / 'exif')
    generate_synthetic_coco(root, num_train=2, num_val=1, seed=2,
                            min_size=64, max_size=96)
    path = osp.join(root, 'train', '000001.jpg')
    img = Image.open(path)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90: OpenCV's IMREAD_COLOR turns the image
    img.save(path, 'JPEG', quality=95, exif=exif.tobytes())
    assert img.size[0] != img.size[1]  # seed 2: a square would not show it
    h, w = cv2.imread(path).shape[:2]
    assert (h, w) == img.size  # OpenCV turned it: width and height swap
    result = check_dataset(_dataset(root), 'train set',
                           CheckOptions(cache_dir=None))
    problem, = result.problems
    assert problem.kind == 'size differs from the annotation'
    assert 'EXIF orientation' in problem.reason


def test_hook_arguments():
    with pytest.raises(ValueError, match=r"`splits` entry 'tset', please "
                       r"choose from \('train', 'val', 'test'\)"):
        DatasetCheckHook(splits=('train', 'tset'))
    with pytest.raises(ValueError, match='`skip_bad_images` must be True or '
                       "False, got 'yes'"):
        DatasetCheckHook(skip_bad_images='yes')
    hook = DatasetCheckHook()
    assert hook.splits == ('train', 'val', 'test')
    assert not hook.skip_bad_images


def test_standalone_tool(coco_set, tmp_path, capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'mmpe_tool_check_dataset',
        osp.join(ROOT, 'tools', 'analysis', 'check_dataset.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    bad, want = break_copy(coco_set, tmp_path)
    opts = ['--cfg-options'] + [
        f'{s}_dataloader.dataset.data_root={bad}/' for s in
        ('train', 'val', 'test')
    ]
    config = osp.join(ROOT, 'configs', 'quickstart',
                      'mask-rcnn_cpvt-tiny_synthetic.py')
    assert tool.main([config, '--no-cache', *opts]) == 2
    out = capsys.readouterr().out
    for path, _, _ in want:
        assert path in out
    assert 'train: 8 problem(s) in 8 file(s)' in out
    assert 'val: no problems' in out and 'test:' not in out  # test == val
    assert tool.main([config, '--no-cache', '--splits', 'val', *opts]) == 0
