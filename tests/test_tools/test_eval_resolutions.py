"""tools/analysis/eval_resolutions.py: test-pipeline rescaling on every
config, and end-to-end runs (DETR family, CPVT Mask R-CNN) that check the
images the model got and the weights it loaded."""
import argparse
import copy
import glob
import importlib.util
import json
import os
import os.path as osp

import pytest
import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    'eval_resolutions', osp.join(REPO, 'tools/analysis/eval_resolutions.py'))
eval_resolutions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eval_resolutions)
# the test configs it makes, beside the script (pytest.ini's pythonpath)
resolution_configs = importlib.import_module('resolution_configs')

ALL_CONFIGS = sorted(
    glob.glob(osp.join(REPO, 'configs', '*.py')) +
    glob.glob(osp.join(REPO, 'configs', 'quickstart', '*.py')))
QUICKSTART = osp.join(REPO, 'configs', 'quickstart')
E2E_CONFIGS = [
    'detr_irpe_r18_synthetic.py', 'conditional-detr_irpe_r18_synthetic.py',
    'dab-detr_irpe_r18_synthetic.py', 'mask-rcnn_cpvt-tiny_synthetic.py'
]


def keep_ratio_shape(h, w, resize, factor):
    """(h, w) after mmcv's Resize(keep_ratio=True) of the config's original
    ``resize`` with its sizes times ``factor`` (pixels rounded): the scale
    is min(long / max(h, w), short / min(h, w)) for ``scale=(long,
    short)``, ``scale_factor`` otherwise; sides are int(side * s + 0.5).
    Without ``keep_ratio`` (RT-DETR's square resize) the image is the
    scaled ``scale=(w, h)`` whatever its own shape."""
    if not resize.get('keep_ratio', False) and resize.get('scale'):
        w, h = (int(round(v * factor)) for v in resize['scale'])
        return h, w
    if resize.get('scale') is not None:
        target = [int(round(v * factor)) for v in resize['scale']]
        s = min(max(target) / max(h, w), min(target) / min(h, w))
    else:
        s = resize['scale_factor'] * factor
    return int(h * s + 0.5), int(w * s + 0.5)


@pytest.mark.parametrize('factor', [0.5, 1.0, 1.5, 2.0])
def test_rescale_pipeline(factor):
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=(1333, 800), keep_ratio=True),
        dict(type='FixScaleResize', scale=[256, 128]),
        dict(type='RandomResize', scale_factor=0.5),
        dict(
            type='TestTimeAug',
            transforms=[[dict(type='Resize', scale=(100, 60))],
                        [dict(type='PackDetInputs')]]),
        dict(type='PackDetInputs')
    ]
    original = copy.deepcopy(pipeline)
    changed = resolution_configs.rescale_pipeline(pipeline, factor)
    assert len(changed) == 4
    assert pipeline[1]['scale'] == (round(1333 * factor), round(800 * factor))
    assert isinstance(pipeline[1]['scale'], tuple)
    assert pipeline[2]['scale'] == [round(256 * factor), round(128 * factor)]
    assert pipeline[3]['scale_factor'] == pytest.approx(0.5 * factor)
    assert pipeline[4]['transforms'][0][0]['scale'] == (round(100 * factor),
                                                         round(60 * factor))
    assert pipeline[0] == original[0] and pipeline[-1] == original[-1]


def test_rescale_other_resizes_and_fixed_pad():
    pipeline = [
        dict(type='Resize', scale_factor=1, keep_ratio=True),  # int factor
        dict(type='mmdet.FixShapeResize', width=640, height=480),
        dict(type='RandomChoiceResize', scales=[(640, 480), (800, 600)]),
        dict(type='ResizeShortestEdge', scale=800, max_size=1333),
        dict(type='Pad', size=(640, 640)),
        dict(type='Pad', size_divisor=32),
    ]
    resolution_configs.rescale_pipeline(pipeline, 1.5)
    assert pipeline[0]['scale_factor'] == 1.5  # not rounded to 2
    assert (pipeline[1]['width'], pipeline[1]['height']) == (960, 720)
    assert pipeline[2]['scales'] == [(960, 720), (1200, 900)]
    assert (pipeline[3]['scale'], pipeline[3]['max_size']) == (1200, 2000)
    assert pipeline[4]['size'] == (960, 960)
    assert pipeline[5] == dict(type='Pad', size_divisor=32)


def test_rescale_pipeline_without_resize():
    pipeline = [dict(type='LoadImageFromFile'), dict(type='PackDetInputs')]
    assert resolution_configs.rescale_pipeline(pipeline, 2.0) == []


def test_dataset_pipelines_through_wrappers_and_concat():
    from mmengine.config import Config
    a, b, c = ([dict(type='Resize', scale=(10, 10))] for _ in range(3))
    cfg = Config(
        dict(
            test_dataloader=dict(
                dataset=dict(
                    type='ConcatDataset',
                    datasets=[
                        dict(
                            type='RepeatDataset',
                            dataset=dict(type='CocoDataset', pipeline=a)),
                        dict(type='CocoDataset', pipeline=b),
                        dict(type='CocoDataset', pipeline=c)
                    ]))))
    assert resolution_configs.dataset_pipelines(cfg) == [b, c, a]


@pytest.mark.parametrize('test_dataloader', [None, dict(batch_size=1)])
def test_dataset_pipelines_refuses_config_without_test_set(test_dataloader):
    from mmengine.config import Config
    cfg = Config(dict(test_dataloader=test_dataloader))
    with pytest.raises(ValueError, match='test_dataloader'):
        resolution_configs.dataset_pipelines(cfg)


@pytest.mark.parametrize('factor', [1.0, 1.5])
def test_resize_inserted_when_pipeline_has_none(factor):
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations'),
        dict(type='PackDetInputs')
    ]
    changed = resolution_configs.rescale_or_insert(pipeline, factor)
    assert len(changed) == 1
    if factor == 1.0:
        assert len(pipeline) == 3
    else:
        assert pipeline[1] == dict(
            type='Resize', scale_factor=factor, keep_ratio=True)
        assert [t['type'] for t in pipeline] == [
            'LoadImageFromFile', 'Resize', 'LoadAnnotations', 'PackDetInputs'
        ]


@pytest.fixture(scope='module')
def image_640x480(tmp_path_factory):
    import mmcv
    import numpy as np
    path = str(tmp_path_factory.mktemp('img') / 'img.jpg')
    mmcv.imwrite(np.full((480, 640, 3), 127, np.uint8), path)
    return path


def test_every_config_test_pipeline_scales(image_640x480, tmp_path):
    """Every detection config's test pipeline, rescaled by the tool, built
    with mmdet and run on a 640 x 480 image: the packed img_shape is the
    original Resize's result with sizes x1.5 (COCO configs: Resize (1333,
    800) -> (2000, 1200), so 1600 x 1200). MMSegmentation configs are not
    the tool's."""
    from mmengine.config import Config
    from mmengine.dataset import Compose
    assert len(ALL_CONFIGS) >= 7 + 12
    for path in ALL_CONFIGS:
        cfg = Config.fromfile(path)
        if cfg.get('default_scope', 'mmdet') != 'mmdet':
            continue  # MMSegmentation configs: not a detector's pipeline
        resize = next(t for t in resolution_configs.dataset_pipelines(cfg)[0]
                      if t['type'] == 'Resize')
        resize = copy.deepcopy(resize)
        for factor in (1.0, 1.5):
            run_cfg, changed = resolution_configs.scale_config(
                cfg, factor, 'ckpt.pth', str(tmp_path))
            assert changed, path
            assert run_cfg.load_from == 'ckpt.pth'
            assert run_cfg.work_dir == str(tmp_path / f'scale_{factor:g}')
            pipelines = resolution_configs.dataset_pipelines(run_cfg)
            packed = Compose(pipelines[0])(
                dict(img_path=image_640x480, img_id=0, instances=[]))
            got = packed['data_samples'].img_shape
            assert got == keep_ratio_shape(480, 640, resize, factor), path
            if resize.get('scale') == (1333, 800):
                assert got == ((800, 1067) if factor == 1 else (1200, 1600))
        # the original config is left as it was
        assert resolution_configs.dataset_pipelines(cfg)[0][1] == resize


# ---------------------------------------------------------------- end to end
@pytest.fixture(scope='module')
def tiny_val(tmp_path_factory):
    from mmpe.datasets import generate_synthetic_coco
    root = str(tmp_path_factory.mktemp('synthetic'))
    generate_synthetic_coco(
        root, num_train=0, num_val=6, seed=5, min_size=96, max_size=128)
    with open(osp.join(root, 'annotations', 'instances_val.json')) as f:
        images = json.load(f)['images']
    return root, {im['id']: (im['height'], im['width']) for im in images}


def _save_checkpoint(cfg, path, marker_key):
    """A freshly built model's weights, with ``marker_key`` set to a known
    value, so the run can show that the file's weights were loaded."""
    from mmdet.registry import MODELS
    torch.manual_seed(0)
    state = MODELS.build(copy.deepcopy(cfg.model)).state_dict()
    state[marker_key] = torch.full_like(state[marker_key], 0.321)
    torch.save({'state_dict': state, 'meta': {}}, path)
    return state


def _options(root):
    return [
        f'test_dataloader.dataset.data_root={root}/',
        f'test_evaluator.ann_file={root}/annotations/instances_val.json',
        'test_dataloader.dataset.indices=4', 'test_dataloader.num_workers=0',
        'test_dataloader.batch_size=2'
    ]


@pytest.fixture
def seen(monkeypatch):
    """What every detector's predict forward got: per call, the batch input
    shape, (img_id, img_shape) per sample and the marker parameter."""
    from mmdet.models.detectors.base import BaseDetector
    calls, forward = [], BaseDetector.forward

    def recording_forward(self, inputs, data_samples=None, mode='tensor'):
        if mode == 'predict':
            calls.append(
                dict(
                    inputs=tuple(inputs.shape[-2:]),
                    samples=[(s.img_id, tuple(s.img_shape))
                             for s in data_samples],
                    marker=self.state_dict()[calls_marker[0]].flatten()[0]))
        return forward(self, inputs, data_samples, mode)

    calls_marker = []
    monkeypatch.setattr(BaseDetector, 'forward', recording_forward)
    return calls, calls_marker


@pytest.mark.parametrize('name', E2E_CONFIGS)
def test_end_to_end(name, tiny_val, seen, tmp_path):
    from mmengine.config import Config
    root, sizes = tiny_val
    config = osp.join(QUICKSTART, name)
    cfg = Config.fromfile(config)
    marker = 'bbox_head.fc_cls.bias' if 'mask-rcnn' not in name else \
        'roi_head.bbox_head.fc_cls.bias'
    calls, calls_marker = seen
    calls_marker.append(marker)
    ckpt = str(tmp_path / 'model.pth')
    _save_checkpoint(cfg, ckpt, marker)
    work_dir = tmp_path / 'out'
    rc = eval_resolutions.main([
        config, ckpt, '--scales', '1.0', '1.5', '--work-dir',
        str(work_dir), '--cfg-options', *_options(root)
    ])
    assert rc == 0
    with open(work_dir / 'eval_resolutions.json') as f:
        results = json.load(f)['results']
    assert [r['scale'] for r in results] == [1.0, 1.5]
    want = {'coco/bbox_mAP', 'coco/bbox_mAP_50'}
    if 'mask-rcnn' in name:
        want |= {'coco/segm_mAP', 'coco/segm_mAP_50'}
    for r in results:
        assert want <= set(r['metrics']), r['metrics']
        assert all(0 <= r['metrics'][k] <= 1 for k in want)

    # 2 batches of 2 images per scale; the checkpoint's weights in use
    assert len(calls) == 4
    assert all(float(c['marker']) == pytest.approx(0.321) for c in calls)
    resize = next(t for t in resolution_configs.dataset_pipelines(cfg)[0]
                  if t['type'] == 'Resize')
    for r, scale_calls in zip(results, (calls[:2], calls[2:])):
        shapes = []
        for call in scale_calls:
            for img_id, shape in call['samples']:
                h, w = sizes[img_id]
                assert shape == keep_ratio_shape(h, w, resize, r['scale'])
                assert call['inputs'][0] >= shape[0]
                assert call['inputs'][1] >= shape[1]
                shapes.append(shape)
        assert r['images']['num_images'] == 4
        assert r['images']['max_img_shape'] == [
            max(s[0] for s in shapes), max(s[1] for s in shapes)
        ]
    if 'detr' in name:  # Resize to fit (128, 128), then (192, 192)
        assert max(results[0]['images']['max_img_shape']) == 128
        assert max(results[1]['images']['max_img_shape']) == 192
    # each scale logs and visualises into its own folder
    for factor in ('1', '1.5'):
        run_dir = work_dir / f'scale_{factor}'
        assert len(glob.glob(str(run_dir / '*' / '*.log'))) == 1
        assert glob.glob(str(run_dir / '*' / 'vis_data' / 'config.py'))


def test_refuses_unsafe_checkpoint_unless_allowed(tiny_val, seen, tmp_path,
                                                  monkeypatch):
    from mmengine.config import Config

    from mmpe.engine import UNSAFE_LOAD_ENV, UnsafeCheckpointError
    monkeypatch.setenv(UNSAFE_LOAD_ENV, '0')  # restored after the test
    root, _ = tiny_val
    config = osp.join(QUICKSTART, 'detr_irpe_r18_synthetic.py')
    calls, calls_marker = seen
    calls_marker.append('bbox_head.fc_cls.bias')
    ckpt = str(tmp_path / 'model.pth')
    state = _save_checkpoint(Config.fromfile(config), ckpt,
                             'bbox_head.fc_cls.bias')
    # a pickled object outside the weights-only allow-list
    torch.save({'state_dict': state, 'meta': argparse.Namespace(a=1)}, ckpt)
    args = [config, ckpt, '--work-dir', str(tmp_path / 'out'),
            '--cfg-options', *_options(root)]
    with pytest.raises(UnsafeCheckpointError):
        eval_resolutions.main(args)
    assert calls == []
    assert eval_resolutions.main(args + ['--allow-unsafe-checkpoint']) == 0
    assert os.environ[UNSAFE_LOAD_ENV] == '0'  # an argument, not the env
    assert len(calls) == 2
    assert all(float(c['marker']) == pytest.approx(0.321) for c in calls)


def test_missing_checkpoint_or_data_exits_2(tmp_path, capsys):
    config = osp.join(QUICKSTART, 'detr_r18_synthetic.py')
    assert eval_resolutions.main([config, str(tmp_path / 'none.pth')]) == 2
    assert 'none.pth' in capsys.readouterr().err
    ckpt = tmp_path / 'x.pth'
    ckpt.write_bytes(b'')
    missing = str(tmp_path / 'synthetic_nowhere')
    assert eval_resolutions.main([
        config,
        str(ckpt), '--work-dir',
        str(tmp_path / 'out'), '--cfg-options',
        f'test_dataloader.dataset.data_root={missing}/'
    ]) == 2
    err = capsys.readouterr().err
    assert missing in err and 'make_synthetic_coco.py' in err


# ------------------------------------------------------------------- canvas
def test_canvas_test_draws_a_larger_set_at_the_same_object_scale(
        tiny_val, seen, tmp_path):
    """--canvas 2: the embedded set drawn again with its generator's
    parameters on a canvas twice as large per side, the resize sizes
    doubled too: each canvas image is resized by the factor of its
    half-size base, so objects keep the x1 test's scale while the images
    (and the encoder's grid) double."""
    from mmengine.config import Config
    root, _ = tiny_val
    config = osp.join(QUICKSTART, 'detr_rope-mixed_r18_synthetic.py')
    cfg = Config.fromfile(config)
    calls, calls_marker = seen
    calls_marker.append('bbox_head.fc_cls.bias')
    ckpt = str(tmp_path / 'model.pth')
    _save_checkpoint(cfg, ckpt, 'bbox_head.fc_cls.bias')
    work_dir = tmp_path / 'out'
    rc = eval_resolutions.main([
        config, ckpt, '--scales', '1.0', '--canvas', '2.0', '--work-dir',
        str(work_dir), '--cfg-options', *_options(root)
    ])
    assert rc == 0
    canvas_root = root + '_canvas2'
    with open(osp.join(canvas_root, 'annotations',
                       'synthetic_coco_meta.json')) as f:
        params = json.load(f)['params']
    # the fixture's parameters, the canvas factor, the validation split
    assert (params['seed'], params['min_size'], params['max_size'],
            params['canvas'], params['num_train'], params['num_val']) == (
                5, 96, 128, 2.0, 0, 6)
    with open(osp.join(canvas_root, 'annotations',
                       'instances_val.json')) as f:
        sizes = {im['id']: (im['height'], im['width'])
                 for im in json.load(f)['images']}
    assert all(96 * 2 <= max(s) <= 128 * 2 for s in sizes.values())
    with open(work_dir / 'eval_resolutions.json') as f:
        results = json.load(f)['results']
    assert [(r['test'], r['scale']) for r in results] == [('resize', 1.0),
                                                          ('canvas', 2.0)]
    resize = next(t for t in resolution_configs.dataset_pipelines(cfg)[0]
                  if t['type'] == 'Resize')
    for call in calls[2:]:  # the canvas run's two batches
        for img_id, shape in call['samples']:
            h, w = sizes[img_id]
            assert shape == keep_ratio_shape(h, w, resize, 2.0)
            # the factor an image of the base size gets at x1: 128 / long
            base_factor = 128 / max(h / 2, w / 2)
            assert max(shape) / max(h, w) == pytest.approx(base_factor,
                                                           abs=0.01)
    assert results[1]['images']['num_images'] == 4
    assert max(results[1]['images']['max_img_shape']) == 256
    assert all(float(c['marker']) == pytest.approx(0.321) for c in calls)
    assert glob.glob(str(work_dir / 'canvas_2' / '*' / '*.log'))
    # a second run finds the canvas set and reuses it
    mtime = osp.getmtime(osp.join(canvas_root, 'val', '000000.jpg'))
    assert eval_resolutions.main([
        config, ckpt, '--canvas', '2.0', '--work-dir', str(work_dir),
        '--cfg-options', *_options(root)
    ]) == 0
    assert osp.getmtime(osp.join(canvas_root, 'val',
                                 '000000.jpg')) == mtime


def test_canvas_needs_the_generators_record(tiny_val, tmp_path, capsys):
    import shutil
    root, _ = tiny_val
    copy_root = str(tmp_path / 'copied')
    shutil.copytree(root, copy_root)
    os.remove(osp.join(copy_root, 'annotations', 'synthetic_coco_meta.json'))
    ckpt = tmp_path / 'x.pth'
    ckpt.write_bytes(b'')
    config = osp.join(QUICKSTART, 'detr_r18_synthetic.py')
    assert eval_resolutions.main([
        config, str(ckpt), '--canvas', '2', '--work-dir',
        str(tmp_path / 'out'), '--cfg-options', *_options(copy_root)
    ]) == 2
    err = capsys.readouterr().err
    assert 'synthetic_coco_meta.json' in err and 'make_synthetic_coco' in err
    assert not osp.exists(copy_root + '_canvas2')


@pytest.mark.parametrize('canvas', [['1.0'], ['0.5'], ['2', '2.0']])
def test_bad_canvas_factors_are_refused(canvas, capsys):
    with pytest.raises(SystemExit):
        eval_resolutions.parse_args(['c.py', 'x.pth', '--canvas', *canvas])
    assert '--canvas' in capsys.readouterr().err
