"""tools/experiments/ablation.py: every row builds the model it names, and
the summary computes mean and sample std over seeds."""
import copy
import importlib.util
import json
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmengine.config import Config, DictAction

from mmpe.models.layers.irpe import iRPE

ROOT = osp.join(osp.dirname(__file__), '..', '..')
spec = importlib.util.spec_from_file_location(
    'ablation', osp.join(ROOT, 'tools', 'experiments', 'ablation.py'))
ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablation)

# the segmentation studies' rows (mmseg models): tests/test_seg/
ROWS = [(study, *row) for study, rows in ablation.STUDIES.items()
        for row in rows if study not in ablation.SEG_STUDIES]


def _parse(options):
    action = DictAction(option_strings=['--cfg-options'], dest='opts')
    ns = type('NS', (), {})()
    action(None, ns, options)
    return ns.opts


@pytest.mark.parametrize('study,name,config,options', ROWS,
                         ids=[f'{r[0]}:{r[1]}' for r in ROWS])
def test_row_builds_what_it_says(study, name, config, options):
    cfg = Config.fromfile(osp.join(ROOT, config))
    if options:
        cfg.merge_from_dict(_parse(options))
    model = MODELS.build(copy.deepcopy(cfg.model))
    rpes = [m for m in model.modules() if isinstance(m, iRPE)]
    if study == 'irpe_tab6':
        assert bool(rpes) == (name not in ('#2 no PE', '#1 sine (DETR)'))
        has_abs = getattr(model, 'use_abs_pe', True)
        assert has_abs == ('sine' in name)
        if 'bias' in name:
            assert all(r.mode == 'bias' for r in rpes)
        if 'clip' in name:
            assert all(r.index == 'clip' for r in rpes)
    elif study.startswith('encoder_pe'):
        assert type(model).__name__.endswith(
            'ConditionalDETR' if study == 'encoder_pe_cond' else 'DETR')
        assert getattr(model, 'use_abs_pe', True) == ('sine' in name and
                                                      'no sine' not in name)
        attns = [layer.self_attn for layer in model.encoder.layers]
        ropes = {type(getattr(a, 'rope', None)).__name__ for a in attns}
        want = {'RoPE-2D': 'RoPE2D', 'RoPE-Mixed': 'RoPEMixed'}
        assert ropes == {next(
            (v for k, v in want.items() if k in name), 'NoneType')}
        assert bool(rpes) == ('iRPE' in name)
        # every row's decoder keys keep the sine encoding
        assert getattr(model, 'decoder_pos', 'sine') in ('sine', 'encoder')
    elif study == 'irpe_tab1':
        method = name.split()[-1]
        assert rpes and all(r.method == method for r in rpes)
    else:
        pe = name.split()[1]
        assert model.backbone.pos_encoding == pe
        # the padding-aware detector type is the row's only difference
        assert (type(model).__name__ == 'PaddingAwareMaskRCNN') == (
            'padding mask' in name)
        # only the 'peg' row has PEGs; 'none' is the control with no PE
        assert bool(len(model.backbone.pegs)) == (pe == 'peg')


def test_summary_mean_and_std():
    results = [
        dict(study='irpe_tab6', row='#6 sine + ctx piecewise', seed=s,
             train_seconds=10.0 + s,
             metrics={'coco/bbox_mAP': ap, 'coco/bbox_mAP_50': ap50})
        for s, ap, ap50 in [(0, 0.1, 0.3), (1, 0.2, 0.4), (2, 0.3, 0.5)]
    ]
    table = ablation.summarise(results)
    assert '| #6 sine + ctx piecewise | 0.200 ± 0.100 | 0.400 ± 0.100 | '\
        '11 ± 1 |' in table


def test_identical_rows_run_once(tmp_path, monkeypatch):
    """Tab. 1 'ctx product' is Tab. 6 #6's command: reused, not re-run."""
    calls = []

    def fake_run_one(study, name, config, options, seed, args):
        calls.append((study, name, seed, args.epochs))
        return dict(study=study, row=name, seed=seed, config=config,
                    options=options, train_seconds=1.0,
                    metrics={'coco/bbox_mAP': 0.1 + seed,
                             'coco/bbox_mAP_50': 0.2})

    monkeypatch.setattr(ablation, 'run_one', fake_run_one)
    out = tmp_path / 'runs.json'
    argv = ['--studies', 'irpe_tab6', 'irpe_tab1', '--rows', '#6',
            'product', '--seeds', '0', '1', '--out', str(out),
            '--work-dir', str(tmp_path)]
    assert ablation.main(argv) == 0
    assert calls == [('irpe_tab6', '#6 sine + ctx piecewise', 0, 8),
                     ('irpe_tab6', '#6 sine + ctx piecewise', 1, 8)]
    runs = json.loads(out.read_text())
    reused = [r for r in runs if r['study'] == 'irpe_tab1']
    assert [r['seed'] for r in reused] == [0, 1]
    assert all(r['same_run_as'] == 'irpe_tab6: #6 sine + ctx piecewise'
               for r in reused)
    assert [r['metrics']['coco/bbox_mAP'] for r in reused] == [0.1, 1.1]
    table = ablation.summarise(runs)
    assert '| ctx product (= irpe_tab6: #6 sine + ctx piecewise) |' in table
    # a second call finds everything done and runs nothing
    assert ablation.main(argv) == 0
    assert len(calls) == 2


def test_cpvt_summary_has_ap_and_ap50_per_scale():
    def scales(ap):
        return [dict(scale=s, metrics={
            'coco/bbox_mAP': ap / s, 'coco/bbox_mAP_50': 2 * ap / s,
            'coco/segm_mAP': ap / (2 * s), 'coco/segm_mAP_50': ap / s})
            for s in ablation.SCALES]

    results = [
        dict(study='cpvt_res', row='CPVT peg', seed=s, epochs=4,
             train_seconds=100.0, metrics={}, scales=scales(ap))
        for s, ap in [(0, 0.1), (1, 0.3)]
    ]
    table = ablation.summarise(results)
    assert '### cpvt_res (seeds [0, 1], epochs [4]): bbox' in table
    assert '### cpvt_res (seeds [0, 1], epochs [4]): segm' in table
    # bbox: AP at x1, x1.5, x2, then AP50 at x1, x1.5, x2
    assert ('| CPVT peg | 0.200 ± 0.141 | 0.133 ± 0.094 | 0.100 ± 0.071 | '
            '0.400 ± 0.283 | 0.267 ± 0.189 | 0.200 ± 0.141 | 100 ± 0 |'
            ) in table


def _fake_result(study, name, config, options, seed, ap50=0.2):
    return dict(study=study, row=name, seed=seed, config=config,
                options=options, train_seconds=1.0,
                metrics={'coco/bbox_mAP': 0.1, 'coco/bbox_mAP_50': ap50})


def test_parallel_jobs_keep_every_run_and_report_failures(
        tmp_path, monkeypatch, capsys):
    """--jobs 2: runs overlap, each gets cores // jobs threads; a failing run
    does not stop the others, is left out of the JSON and makes exit 1."""
    import threading
    lock = threading.Lock()
    state = dict(running=0, peak=0, threads=set())
    # each run waits until a second one runs beside it (no sleep: on a busy
    # machine a fixed delay can pass before the other thread starts); the
    # timeout is only a hang guard, e.g. if runs did not overlap at all
    both_running = threading.Barrier(2, timeout=300)

    def fake_run_one(study, name, config, options, seed, args):
        with lock:
            state['running'] += 1
            state['peak'] = max(state['peak'], state['running'])
            state['threads'].add(args.threads)
        both_running.wait()
        with lock:
            state['running'] -= 1
        if name.startswith('#4') and seed == 1:
            raise RuntimeError('train.py failed')
        return _fake_result(study, name, config, options, seed)

    monkeypatch.setattr(ablation, 'run_one', fake_run_one)
    monkeypatch.setattr(ablation.os, 'cpu_count', lambda: 4)
    out = tmp_path / 'runs.json'
    argv = ['--studies', 'irpe_tab6', '--rows', '#3', '#4', '--seeds', '0',
            '1', '--jobs', '2', '--out', str(out), '--work-dir',
            str(tmp_path)]
    assert ablation.main(argv) == 1
    assert state['peak'] == 2 and state['threads'] == {2}
    runs = json.loads(out.read_text())
    assert sorted((r['row'][:2], r['seed']) for r in runs) == [
        ('#3', 0), ('#3', 1), ('#4', 0)]
    assert '#4 ctx, no abs PE | seed 1: train.py failed' in \
        capsys.readouterr().err
    # the failed run is the only one tried again
    monkeypatch.setattr(
        ablation, 'run_one',
        lambda *a: _fake_result(*a[:5]) if a[1].startswith('#4') and a[4] == 1
        else pytest.fail(f'{a[1]} seed {a[4]} re-run'))
    assert ablation.main(argv) == 0
    assert len(json.loads(out.read_text())) == 4


@pytest.mark.parametrize('argv', [['--jobs', '0'], ['--threads', '0']])
def test_bad_jobs_or_threads_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        ablation.parse_args(argv)
    assert argv[0] in capsys.readouterr().err


def test_summary_rows_in_study_order():
    rows = ['#5 sine + ctx clip', '#2 no PE', '#1 sine (DETR)']
    results = [
        dict(study='irpe_tab6', row=row, seed=0, train_seconds=1.0,
             metrics={'coco/bbox_mAP': 0.1, 'coco/bbox_mAP_50': 0.2})
        for row in rows
    ]
    table = ablation.summarise(results)
    assert [table.index(f'| {r} |') for r in
            ['#2 no PE', '#1 sine (DETR)', '#5 sine + ctx clip']] == sorted(
                table.index(f'| {r} |') for r in rows)
