"""tools/analysis/eval_resolutions.py: test-pipeline rescaling."""
import copy
import importlib.util
import os.path as osp

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    'eval_resolutions', osp.join(REPO, 'tools/analysis/eval_resolutions.py'))
eval_resolutions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eval_resolutions)


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
    changed = eval_resolutions.rescale_pipeline(pipeline, factor)
    assert len(changed) == 4
    assert pipeline[1]['scale'] == (round(1333 * factor), round(800 * factor))
    assert isinstance(pipeline[1]['scale'], tuple)
    assert pipeline[2]['scale'] == [round(256 * factor), round(128 * factor)]
    assert pipeline[3]['scale_factor'] == pytest.approx(0.5 * factor)
    assert pipeline[4]['transforms'][0][0]['scale'] == (round(100 * factor),
                                                         round(60 * factor))
    assert pipeline[0] == original[0] and pipeline[-1] == original[-1]


def test_rescale_pipeline_without_resize():
    pipeline = [dict(type='LoadImageFromFile'), dict(type='PackDetInputs')]
    assert eval_resolutions.rescale_pipeline(pipeline, 2.0) == []


def test_test_pipeline_through_dataset_wrappers():
    from mmengine.config import Config
    pipeline = [dict(type='Resize', scale=(10, 10))]
    cfg = Config(
        dict(
            test_dataloader=dict(
                dataset=dict(
                    type='RepeatDataset',
                    dataset=dict(type='CocoDataset', pipeline=pipeline)))))
    assert eval_resolutions._test_pipeline(cfg) == pipeline


@pytest.mark.parametrize('factor', [1.0, 1.5])
def test_resize_inserted_when_pipeline_has_none(factor):
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations'),
        dict(type='PackDetInputs')
    ]
    changed = eval_resolutions.rescale_or_insert(pipeline, factor)
    assert len(changed) == 1
    if factor == 1.0:
        assert len(pipeline) == 3
    else:
        assert pipeline[1] == dict(
            type='Resize', scale_factor=factor, keep_ratio=True)
        assert [t['type'] for t in pipeline] == [
            'LoadImageFromFile', 'Resize', 'LoadAnnotations', 'PackDetInputs'
        ]
