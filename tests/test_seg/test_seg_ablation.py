"""tools/experiments/ablation.py's segmentation study (cpvt_seg): every row
builds the model it names, the test settings change what they say, the
metrics are read from the runs' files and the table has mean and sample std
per test setting."""
import argparse
import copy
import importlib.util
import json
import os
import os.path as osp

import pytest
from mmengine.config import Config, DictAction
from mmengine.registry import DefaultScope

from mmseg.registry import MODELS

ROOT = osp.join(osp.dirname(__file__), '..', '..')
spec = importlib.util.spec_from_file_location(
    'ablation_seg', osp.join(ROOT, 'tools', 'experiments', 'ablation.py'))
ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablation)
# the modules beside the script (pytest.ini's pythonpath: tools/experiments)
ablation_runs = importlib.import_module('ablation_runs')
studies = importlib.import_module('ablation_studies')
ROWS = studies.STUDIES['cpvt_seg']


def _parse(options):
    action = DictAction(option_strings=['--cfg-options'], dest='opts')
    ns = argparse.Namespace()
    action(None, ns, options)
    return ns.opts


def _cfg(config, options):
    cfg = Config.fromfile(osp.join(ROOT, config))
    if options:
        cfg.merge_from_dict(_parse(options))
    return cfg


@pytest.mark.parametrize('name,config,options', ROWS,
                         ids=[r[0] for r in ROWS])
def test_row_builds_what_it_says(name, config, options):
    cfg = _cfg(config, options)
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(copy.deepcopy(cfg.model))
    if name.startswith('CPVT'):
        pe = name.split()[1]
        assert type(model).__name__ == 'PaddingAwareEncoderDecoder'
        assert model.backbone.pos_encoding == pe
        assert bool(len(model.backbone.pegs)) == (pe == 'peg')
    else:
        assert type(model.backbone).__name__ == 'PCPVT'
    n_params = sum(p.numel() for p in model.backbone.parameters())
    assert 0.85e6 < n_params < 0.95e6  # tiny CPVT 0.89 M, PCPVT 0.90 M


def test_test_settings_change_scale_or_mode():
    base = ROWS[0][1:]
    for test, opts in studies.SEG_TESTS.items():
        cfg = _cfg(base[0], base[1] + (opts or []))
        resize = cfg.test_dataloader.dataset.pipeline[1]
        assert resize.type == 'Resize'
        if test == 'slide':
            assert resize.scale_factor == 1.0
            assert cfg.model.test_cfg.mode == 'slide'
            assert tuple(cfg.model.test_cfg.crop_size) == tuple(cfg.crop_size)
        else:
            assert resize.scale_factor == float(test[1:])
            assert cfg.model.test_cfg.mode == 'whole'


def test_run_seg_one_reads_the_metrics(tmp_path, monkeypatch):
    commands = []

    def fake_run(cmd, log_file, threads=None):
        commands.append(cmd)
        work_dir = cmd[cmd.index('--work-dir') + 1]
        if cmd[0] == 'tools/train.py':
            vis = osp.join(work_dir, '20240101_000000', 'vis_data')
            os.makedirs(vis, exist_ok=True)
            with open(osp.join(vis, 'scalars.json'), 'w') as f:
                f.write(json.dumps(dict(loss=1.0, step=10)) + '\n')
                f.write(json.dumps(dict(mIoU=50.0, step=20)) + '\n')
        else:
            run = osp.join(work_dir, '20240101_000001')
            os.makedirs(run, exist_ok=True)
            scale = len(commands)  # a different number per test
            with open(osp.join(run, '20240101_000001.json'), 'w') as f:
                f.write(json.dumps(dict(aAcc=90.0, mIoU=10.0 * scale)))
        return 2.0

    monkeypatch.setattr(ablation_runs, 'run_script', fake_run)
    args = argparse.Namespace(work_dir=str(tmp_path), epochs=20,
                              data_root='/data/seg', threads=1)
    name, config, options = ROWS[0]
    result = ablation.run_seg_one('cpvt_seg', name, config, options, 3, args)
    assert result['metrics']['mIoU'] == 50.0
    # x1: the final validation (the same pipeline and metric)
    assert result['tests'] == {'x1': 50.0, 'x1.5': 20.0, 'x2': 30.0,
                               'slide': 40.0}
    assert len(commands) == 4
    train = commands[0]
    for opt in ('randomness.seed=3', 'train_cfg.max_iters=20',
                'param_scheduler.1.end=20',
                'val_dataloader.dataset.data_root=/data/seg/',
                *options):
        assert opt in train
    assert all(c[2].endswith('iter_20.pth') for c in commands[1:])


def test_summary_per_test_setting():
    results = [
        dict(study='cpvt_seg', row='CPVT peg', seed=s, epochs=500,
             train_seconds=100.0 + s, metrics=dict(mIoU=x1),
             tests={'x1': x1, 'x1.5': x1 - 10, 'x2': x1 - 20,
                    'slide': x1 + 1})
        for s, x1 in [(0, 60.0), (1, 70.0)]
    ]
    table = ablation.summarise(results)
    assert '### cpvt_seg (seeds [0, 1], iterations [500])' in table
    assert ('| row | mIoU x1 | mIoU x1.5 | mIoU x2 | mIoU slide | '
            'train s/run |') in table
    assert ('| CPVT peg | 65.0 ± 7.1 | 55.0 ± 7.1 | 45.0 ± 7.1 | '
            '66.0 ± 7.1 | 100 ± 1 |') in table


def test_shape_study_runs_the_same_rows_on_its_own_data(tmp_path,
                                                        monkeypatch):
    assert studies.STUDIES['cpvt_seg_shape'] == ROWS
    commands = []

    def fake_run(cmd, log_file, threads=None):
        commands.append(cmd)
        raise RuntimeError('stop after the training command')

    monkeypatch.setattr(ablation_runs, 'run_script', fake_run)
    args = argparse.Namespace(work_dir=str(tmp_path), epochs=20,
                              data_root=None, threads=1)
    with pytest.raises(RuntimeError, match='stop'):
        ablation.run_seg_one('cpvt_seg_shape', *ROWS[0], 0, args)
    assert ('train_dataloader.dataset.data_root=data/synthetic_seg_shape/'
            in commands[0])


def test_shape_study_data_is_made_with_random_hues_or_refused(tmp_path):
    # the generator's own meta file says how the set was drawn
    root = str(tmp_path / 'shape')
    args = argparse.Namespace(data_root=root)
    ablation.make_study_data('cpvt_seg_shape', args)
    with open(osp.join(root, 'annotations',
                       'synthetic_coco_meta.json')) as f:
        assert json.load(f)['params']['object_hue'] == 'random'
    assert len(os.listdir(osp.join(root, 'seg_maps', 'val'))) == 100
    ablation.make_study_data('cpvt_seg_shape', args)  # found: a no-op
    # a class-hue set is not silently used for the shape study
    other = str(tmp_path / 'class')
    from mmpe.datasets import generate_synthetic_seg
    generate_synthetic_seg(other, num_train=2, num_val=1)
    with pytest.raises(SystemExit, match='object-hue random'):
        ablation.make_study_data('cpvt_seg_shape',
                                 argparse.Namespace(data_root=other))


def test_shape_study_never_reuses_a_colour_run():
    # the same config, options, seed and iterations, but other data
    name, config, options = ROWS[0]
    colour_run = dict(study='cpvt_seg', row=name, config=config,
                      options=options, seed=0, epochs=20)
    args = argparse.Namespace(studies=['cpvt_seg_shape', 'cpvt_seg'],
                              seeds=[0], epochs=20, quick=False,
                              rows=[name], exclude_rows=[])
    runs, copies = ablation._plan(args, [colour_run])
    assert [(r[0], r[1]) for r in runs] == [('cpvt_seg_shape', name)]
    assert copies == []
