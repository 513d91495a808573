"""tools/experiments/ablation.py: every row builds the model it names, and
the summary computes mean and sample std over seeds."""
import copy
import importlib.util
import json
import os
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmengine.config import Config, DictAction

from mmpe.models.layers import BoxRPB, iRPE

ROOT = osp.join(osp.dirname(__file__), '..', '..')
spec = importlib.util.spec_from_file_location(
    'ablation', osp.join(ROOT, 'tools', 'experiments', 'ablation.py'))
ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablation)
# the modules beside the script, as it imports them (pytest.ini's
# pythonpath has tools/experiments, as `python tools/experiments/...` has)
ablation_runs = importlib.import_module('ablation_runs')
studies = importlib.import_module('ablation_studies')

# the segmentation studies' rows (mmseg models): tests/test_seg/
ROWS = [(study, *row) for study, rows in studies.STUDIES.items()
        for row in rows if study not in studies.SEG_STUDIES]


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
        biases = {type(getattr(a, 'grid_bias', None)).__name__
                  for a in attns}
        want = {'log-CPB': 'LogCPB', '2D ALiBi': 'ALiBi2D',
                'LookHere': 'LookHere'}
        assert biases == {next(
            (v for k, v in want.items() if k in name), 'NoneType')}
        # every row's decoder keys keep the sine encoding
        assert getattr(model, 'decoder_pos', 'sine') in ('sine', 'encoder')
    elif study.startswith('rope_coords'):
        assert type(model).__name__ == (
            'PEConditionalDETR' if study == 'rope_coords_cond' else
            'PEDETR' if 'sine' != name.split()[-1] else 'DETR')
        assert getattr(model, 'use_abs_pe', True)
        attns = [layer.self_attn for layer in model.encoder.layers]
        ropes = {type(getattr(a, 'rope', None)).__name__ for a in attns}
        assert ropes == {'RoPEMixed' if 'RoPE-Mixed' in name else 'NoneType'}
        coords = getattr(model, 'rope_coords', None)
        if 'RoPE-Mixed' in name:
            assert coords.coords == ('normalized' if 'normalized' in name
                                     else 'index')
            assert coords.normalize == 'separate' and coords.shift == 0
            want = (2.0, 1.2) if 'rescale 2, jitter 1.2' in name else (1, 1)
            assert (coords.rescale, coords.jitter) == want
        else:
            assert coords is None
        assert bool(rpes) == ('iRPE' in name)
        for rpe in rpes:
            assert (rpe.mode, rpe.method) == ('contextual', 'product')
            assert rpe.index == ('clip' if 'clip' in name else 'piecewise')
            if 'clip' in name:
                assert rpe.max_distance == 3
    elif study == 'vitdet_layout':
        layout, pe = name.split()
        assert model.backbone.pos_encoding == pe
        assert type(model).__name__ == 'PaddingAwareMaskRCNN'
        windows = [b.window_size for b in model.backbone.blocks]
        assert windows == ([4, 0, 4, 0] if layout == 'windowed' else [0] * 4)
        assert bool(rpes) == (pe == 'irpe')
        assert bool(len(model.backbone.pegs)) == (pe == 'peg')
        assert bool(len(model.backbone.ropes)) == (pe == 'rope-mixed')
        # rel-pos: the window blocks' tables for 4 x 4, the global ones' for
        # the 16 x 16 pre-training grid
        rel = [b.attn.rel_pos for b in model.backbone.blocks]
        if pe == 'rel-pos':
            assert [r.input_size for r in rel] == [
                (w, w) if w else (16, 16) for w in windows]
        else:
            assert rel == [None] * 4
    elif study.startswith('decoder_rpb'):
        dab = study == 'decoder_rpb_dab'
        assert type(model).__name__ == ('PEDABDETR' if dab else
                                        'PEConditionalDETR')
        assert model.use_abs_pe and model.abs_pe == 'sine'
        assert bool(rpes) == ('iRPE' in name)
        for rpe in rpes:
            assert (rpe.mode, rpe.method, rpe.index) == (
                'contextual', 'product', 'piecewise')
        bias = ('BoxRPB' if dab else 'point-RPB') in name
        assert (model.decoder_pe is not None) == bias
        rpbs = [m for m in model.modules() if isinstance(m, BoxRPB)]
        # one per decoder layer (shared=False), of the detector's variant
        assert len(rpbs) == (len(model.decoder.layers) if bias else 0)
        assert all(r.mode == ('box' if dab else 'point') for r in rpbs)
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
            for s in studies.SCALES]

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


# ---------------------------------------------------------------------------
# the RoPE-coordinate studies: resized and canvas tests of every run
# ---------------------------------------------------------------------------
def test_rope_coords_runs_are_tested_resized_and_on_the_canvas(
        tmp_path, monkeypatch):
    """run_one trains, then calls eval_resolutions.py with 1x, 1.5x, 2x
    resized and the 2x canvas on the last checkpoint, with the run's
    options; the tests' metrics land in the result."""
    commands = []

    def fake_run(cmd, log_file, threads=None):
        commands.append(list(cmd))
        work_dir = cmd[cmd.index('--work-dir') + 1]
        if cmd[0] == 'tools/train.py':
            vis = osp.join(work_dir, '20260101_000000', 'vis_data')
            os.makedirs(vis)
            with open(osp.join(vis, 'scalars.json'), 'w') as f:
                f.write(json.dumps({'coco/bbox_mAP': 0.1,
                                    'coco/bbox_mAP_50': 0.3}) + '\n')
        else:
            os.makedirs(work_dir)
            with open(osp.join(work_dir, 'eval_resolutions.json'), 'w') as f:
                json.dump(dict(results=[
                    dict(test=k, scale=s, metrics={'coco/bbox_mAP_50': s})
                    for k, s in studies.RES_TESTS['rope_coords_detr']
                ]), f)
        return 1.0

    monkeypatch.setattr(ablation_runs, 'run_script', fake_run)
    monkeypatch.setattr(ablation_runs, 'run_script_measured',
                        lambda *a, **k: (fake_run(*a, **k), 0.0))
    args = ablation.parse_args(['--work-dir', str(tmp_path)])
    args.epochs, args.threads = 8, 1
    name, config, options = studies.STUDIES['rope_coords_detr'][3]
    result = ablation.run_one('rope_coords_detr', name, config, options, 2,
                              args)
    train, test = commands
    assert train[:2] == ['tools/train.py', config]
    assert test[:3] == ['tools/analysis/eval_resolutions.py', config,
                        osp.join(tmp_path, 'rope_coords_detr',
                                 train[3].split('/')[-1], 'epoch_8.pth')]
    assert test[3:9] == ['--scales', '1.0', '1.5', '2.0', '--canvas', '2.0']
    # the run's own options (seed, model) reach the test too
    assert test[test.index('--cfg-options') + 1:] == \
        train[train.index('--cfg-options') + 1:]
    assert 'model.encoder_pe.relative.coords=normalized' in test
    assert [(r['test'], r['scale']) for r in result['scales']] == [
        ('resize', 1.0), ('resize', 1.5), ('resize', 2.0), ('canvas', 2.0)]


def test_rope_coords_summary_has_every_test_and_runs_are_not_shared(
        tmp_path, monkeypatch):
    """The table: AP then AP50 at x1, x1.5, x2 and x2 canvas. A run of the
    same command in a study without these tests is trained again, not
    reused (it has no resolution tests); the canvas data are made once,
    before the runs."""
    calls, prepared = [], []

    def fake_run_one(study, name, config, options, seed, args):
        calls.append((study, name, seed))
        res = [dict(test=k, scale=s, metrics={
            'coco/bbox_mAP': 0.1 * s + seed / 10,
            'coco/bbox_mAP_50': (0.4 if k == 'canvas' else 0.2 * s) + seed})
            for k, s in studies.RES_TESTS.get(study, [])]
        return dict(study=study, row=name, seed=seed, config=config,
                    options=options, train_seconds=10.0,
                    metrics={'coco/bbox_mAP': 0.1, 'coco/bbox_mAP_50': 0.2},
                    **(dict(scales=res) if res else {}))

    monkeypatch.setattr(ablation, 'run_one', fake_run_one)
    monkeypatch.setattr(ablation, 'make_canvas_data',
                        lambda studies, args: prepared.append(studies))
    out = tmp_path / 'runs.json'
    argv = ['--studies', 'encoder_pe_detr', 'rope_coords_detr', '--rows',
            'iRPE ctx', 'iRPE piecewise', '--seeds', '0', '1', '--out',
            str(out), '--work-dir', str(tmp_path)]
    assert ablation.main(argv) == 0
    assert sorted(calls) == [
        ('encoder_pe_detr', 'DETR sine + iRPE ctx', 0),
        ('encoder_pe_detr', 'DETR sine + iRPE ctx', 1),
        ('rope_coords_detr', 'DETR sine + iRPE piecewise', 0),
        ('rope_coords_detr', 'DETR sine + iRPE piecewise', 1)]
    assert prepared == [['encoder_pe_detr', 'rope_coords_detr']]
    table = ablation.summarise(json.loads(out.read_text()))
    assert ('| row | bbox AP x1 | bbox AP x1.5 | bbox AP x2 | bbox AP x2 '
            'canvas | bbox AP50 x1 | bbox AP50 x1.5 | bbox AP50 x2 | bbox '
            'AP50 x2 canvas | train s/run |') in table
    # seeds 0 and 1: AP50 x1 0.2 and 1.2 (std 0.707), x2 canvas 0.4 / 1.4
    assert ('| DETR sine + iRPE piecewise | 0.150 ± 0.071 | 0.200 ± 0.071 | '
            '0.250 ± 0.071 | 0.250 ± 0.071 | 0.700 ± 0.707 | 0.800 ± 0.707 | '
            '0.900 ± 0.707 | 0.900 ± 0.707 | 10 ± 0 |') in table


def test_canvas_data_made_from_the_studys_data_root(tmp_path):
    """make_canvas_data writes the x2 canvas set beside the data root the
    runs use, with the generator parameters of that set."""
    from mmpe.datasets import generate_synthetic_coco
    root = str(tmp_path / 'synthetic')
    generate_synthetic_coco(root, num_train=0, num_val=3, seed=9,
                            min_size=64, max_size=96)
    args = ablation.parse_args(['--data-root', root + '/'])
    ablation.make_canvas_data(['irpe_tab6'], args)  # no canvas test: nothing
    assert not osp.exists(root + '_canvas2')
    ablation.make_canvas_data(['rope_coords_cond'], args)
    with open(osp.join(root + '_canvas2', 'annotations',
                       'synthetic_coco_meta.json')) as f:
        params = json.load(f)['params']
    assert (params['canvas'], params['seed'], params['num_val'],
            params['max_size']) == (2.0, 9, 3, 96)
def test_vitdet_layout_rows_pair_every_encoding():
    rows = {name for name, _, _ in studies.STUDIES['vitdet_layout']}
    assert rows == {f'{layout} {pe}' for layout in ('global', 'windowed')
                    for pe in ('none', 'peg', 'learnable', 'irpe',
                               'rope-mixed', 'rel-pos')}
    assert studies.RES_TESTS['vitdet_layout'] == [('resize', 1.0),
                                                ('resize', 2.0)]


def test_vitdet_summary_has_ap_per_size_time_and_memory():
    def scales(ap):
        return [dict(scale=s, metrics={
            'coco/bbox_mAP': ap / s, 'coco/bbox_mAP_50': 2 * ap / s,
            'coco/segm_mAP': ap, 'coco/segm_mAP_50': ap})
            for s in (1.0, 2.0)]

    results = [
        dict(study='vitdet_layout', row='windowed irpe', seed=s, epochs=4,
             train_seconds=t, train_peak_mb=mb, metrics={}, scales=scales(ap))
        for s, ap, t, mb in [(0, 0.1, 100., 900.), (1, 0.3, 110., 1100.)]
    ]
    table = ablation.summarise(results)
    assert '| row | bbox AP x1 | bbox AP x2 | bbox AP50 x1 | bbox AP50 x2 | '\
        'train s/run | train peak MB |' in table
    assert ('| windowed irpe | 0.200 ± 0.141 | 0.100 ± 0.071 | '
            '0.400 ± 0.283 | 0.200 ± 0.141 | 105 ± 7 | 1000 ± 141 |') in table


def test_run_measured_reports_each_childs_peak_memory(tmp_path):
    """Peak RSS of the one child run, not of another child: from a launcher
    as light as ablation_process.py itself (Linux keeps a process's high-water mark
    from before its exec, so the launcher's size is a floor; this test
    process holds torch), a child that holds 300 MB and one that holds
    nothing."""
    import subprocess
    import sys
    big = tmp_path / 'big.py'
    big.write_text('b = bytearray(300 * 1024 * 1024)\nb[::4096] = '
                   'b"x" * len(b[::4096])\n')
    small = tmp_path / 'small.py'
    small.write_text('pass\n')
    launcher = tmp_path / 'launch.py'
    launcher.write_text(
        'import importlib.util, json, sys\n'
        'spec = importlib.util.spec_from_file_location("a", sys.argv[1])\n'
        'a = importlib.util.module_from_spec(spec)\n'
        'spec.loader.exec_module(a)\n'
        'print(json.dumps([a.run_script_measured([f], f + ".log")[1]\n'
        '                  for f in sys.argv[2:]]))\n')
    out = subprocess.run(
        [sys.executable, str(launcher),
         osp.join(ROOT, 'tools', 'experiments', 'ablation_process.py'),
         str(big),
         str(small)], capture_output=True, text=True, check=True).stdout
    big_mb, small_mb = json.loads(out)
    assert big_mb >= 300 > small_mb
    with pytest.raises(RuntimeError, match='failed; see'):
        ablation_runs.run_script_measured(['-c', 'raise SystemExit(3)'],
                                          str(tmp_path / 'f.log'))


@pytest.mark.parametrize('study', ['decoder_rpb_dab', 'decoder_rpb_cond'])
def test_decoder_rpb_rows_differ_only_in_the_bias(study):
    """Each bias row is its no-bias row plus ``model.decoder_pe`` (same
    encoder, decoder, data, schedule, optimizer), so the study compares
    the bias alone."""

    def cfg_of(row):
        _, config, options = row
        cfg = Config.fromfile(osp.join(ROOT, config))
        if options:
            cfg.merge_from_dict(_parse(options))
        return cfg

    rows = studies.STUDIES[study]
    assert len(rows) == 4
    for plain, biased in ((rows[0], rows[1]), (rows[2], rows[3])):
        assert biased[0].startswith(plain[0] + ' + ')
        a, b = cfg_of(plain).to_dict(), cfg_of(biased).to_dict()
        assert a['model'].pop('decoder_pe', None) is None
        assert b['model'].pop('decoder_pe')['type'] == (
            'box-rpb' if study == 'decoder_rpb_dab' else 'point-rpb')
        assert a == b
    assert studies.RES_TESTS[study] == [('resize', 1.0), ('resize', 2.0)]


def test_decoder_rpb_runs_validate_every_epoch_and_keep_the_curve(
        tmp_path, monkeypatch):
    """The run's options validate every epoch, its JSON keeps every
    validation (from scalars.json, a resumed run's later lines winning),
    and the summary has the by-epoch table."""
    commands = []

    def fake_run(cmd, log_file, threads=None):
        commands.append(list(cmd))
        work_dir = cmd[cmd.index('--work-dir') + 1]
        if cmd[0] == 'tools/train.py':
            for stamp, epochs in (('20260101_000000', (1, 2)),
                                  ('20260101_000100', (2, 3))):
                vis = osp.join(work_dir, stamp, 'vis_data')
                os.makedirs(vis)
                with open(osp.join(vis, 'scalars.json'), 'w') as f:
                    f.write(json.dumps(dict(loss=1.0, step=10)) + '\n')
                    for e in epochs:
                        f.write(json.dumps({
                            'coco/bbox_mAP': e / 10 + (stamp[-3] == '1'),
                            'coco/bbox_mAP_50': e / 5, 'step': e}) + '\n')
        else:
            os.makedirs(work_dir, exist_ok=True)
            with open(osp.join(work_dir, 'eval_resolutions.json'), 'w') as f:
                json.dump({'results': [
                    {'test': 'resize', 'scale': s,
                     'metrics': {'coco/bbox_mAP': 0.1 * s,
                                 'coco/bbox_mAP_50': 0.2 * s}}
                    for s in (1.0, 2.0)]}, f)
        return 5.0, 100.0

    monkeypatch.setattr(ablation_runs, 'run_script_measured', fake_run)
    monkeypatch.setattr(ablation_runs, 'run_script',
                        lambda *a, **k: fake_run(*a, **k)[0])
    out = tmp_path / 'runs.json'
    md = tmp_path / 'table.md'
    assert ablation.main([
        '--studies', 'decoder_rpb_cond', '--rows', 'point-RPB',
        '--exclude-rows', 'iRPE', '--seeds', '0', '--epochs', '3',
        '--out', str(out), '--markdown', str(md),
        '--work-dir', str(tmp_path)]) == 0
    train = next(c for c in commands if c[0] == 'tools/train.py')
    assert train[1] == studies.COND_POINT_RPB
    assert 'train_cfg.val_interval=1' in train
    assert 'train_cfg.max_epochs=3' in train
    [run] = json.loads(out.read_text())
    assert run['row'] == 'Cond. DETR sine + point-RPB'
    # epoch 2 from the later (resumed) directory: AP 0.2 + 1
    assert run['val_curve'] == {'epochs': [1, 2, 3],
                                'bbox_mAP': [0.1, 1.2, 1.3],
                                'bbox_mAP_50': [0.2, 0.4, 0.6]}
    assert run['metrics']['coco/bbox_mAP_50'] == 0.6
    table = md.read_text()
    assert '| row | AP50 ep 1 | AP50 ep 2 | AP50 ep 3 |' in table
    assert '| Cond. DETR sine + point-RPB | 0.200 | 0.400 | 0.600 |' in table
    assert '| Cond. DETR sine + point-RPB | 0.100 | 0.200 | 0.200 | 0.400 '\
        '| 5 |' in table
