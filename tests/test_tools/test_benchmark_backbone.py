"""Smoke tests of the layout benchmarks: tools/benchmark/backbone.py (a row
per subprocess, ratios to 'windowed none', the aims checked) and
tools/benchmark/train_step.py's global twin and memory mode. Small runs;
nothing here depends on how fast a row is."""
import json

import pytest

from test_benchmark_and_visualisers import _tool as _script


def _tool(name):
    return _script('benchmark', name)


def test_backbone_benchmark_rows_and_ratios(tmp_path):
    tool = _tool('backbone.py')
    out = tmp_path / 'bb.json'
    tool.main(['--quick', '--sizes', '224x160', '--encodings', 'irpe',
               '--out', str(out)])
    res = json.loads(out.read_text())
    rows = {r['row']: r for r in res['rows']}
    assert list(rows) == ['global none', 'global irpe', 'windowed none',
                          'windowed irpe']
    for r in rows.values():
        assert r['grid'] == [10, 14] and r['peak_mb'] >= r['step_mb'] > 0
        assert r['x_time'] == pytest.approx(
            r['ms'] / rows['windowed none']['ms'])
        assert r['x_step_mb'] == pytest.approx(
            r['step_mb'] / rows['windowed none']['step_mb'])
    assert rows['windowed none']['x_time'] == pytest.approx(1.0)
    aim = rows['windowed irpe']['aim']
    assert (aim['time'], aim['memory']) == (1.2, 1.3)
    assert aim['met'] == (rows['windowed irpe']['x_time'] <= 1.2
                          and rows['windowed irpe']['x_step_mb'] <= 1.3)
    assert 'global irpe' in rows and 'aim' not in rows['global irpe']
    assert rows['global irpe']['x_time_layout'] == pytest.approx(
        rows['global irpe']['ms'] / rows['global none']['ms'])
    assert res['env']['load_avg_start'] and res['args']['depth'] == 3


def test_backbone_benchmark_windows_only_layout(tmp_path):
    tool = _tool('backbone.py')
    out = tmp_path / 'bb.json'
    tool.main(['--quick', '--sizes', '224x160', '--encodings', 'rope2d',
               '--layouts', 'windows-only', '--repeats', '1', '--out',
               str(out)])
    rows = {r['row']: r for r in json.loads(out.read_text())['rows']}
    assert list(rows) == ['windows-only none', 'windows-only rope2d']
    # no 'windowed none' in this run: no ratio to it, none to its own layout
    assert rows['windows-only rope2d']['x_time'] is None
    assert rows['windows-only none']['x_time_layout'] == pytest.approx(1.0)


def test_backbone_benchmark_rel_pos_rows(tmp_path):
    """ViTDet's decomposed relative position is a row of its own, in both
    layouts (no class token: it builds and steps)."""
    tool = _tool('backbone.py')
    assert 'rel-pos' in tool.ENCODINGS
    out = tmp_path / 'bb.json'
    tool.main(['--quick', '--sizes', '224x160', '--encodings', 'rel-pos',
               '--out', str(out)])
    rows = {r['row']: r for r in json.loads(out.read_text())['rows']}
    assert list(rows) == ['global none', 'global rel-pos', 'windowed none',
                          'windowed rel-pos']
    for r in rows.values():
        assert 'error' not in r and r['ms'] > 0
    assert 'aim' not in rows['windowed rel-pos']  # the aim is iRPE's


def test_backbone_benchmark_bf16_rows(tmp_path):
    """--dtypes float32 bfloat16: every row twice, ratios within a dtype
    (each dtype's own baseline) and to the same row in float32."""
    tool = _tool('backbone.py')
    out = tmp_path / 'bb.json'
    tool.main(['--quick', '--sizes', '224x160', '--encodings', 'irpe',
               '--layouts', 'global', '--dtypes', 'float32', 'bfloat16',
               '--out', str(out)])
    rows = {(r['dtype'], r['row']): r
            for r in json.loads(out.read_text())['rows']}
    assert list(rows) == [('float32', 'global none'),
                          ('float32', 'global irpe'),
                          ('bfloat16', 'global none'),
                          ('bfloat16', 'global irpe')]
    for (dtype, row), r in rows.items():
        assert 'error' not in r and r['ms'] > 0
        assert r['x_time_f32'] == pytest.approx(
            r['ms'] / rows['float32', row]['ms'])
        assert r['x_time_layout'] == pytest.approx(
            r['ms'] / rows[dtype, 'global none']['ms'])


def test_backbone_benchmark_global_blocks_follow_vitdet():
    tool = _tool('backbone.py')
    assert tool.global_blocks(12) == (2, 5, 8, 11)
    assert tool.global_blocks(3) == (2, )


def test_backbone_benchmark_failed_row_is_reported():
    tool = _tool('backbone.py')
    for bad in (['--depth', '0'], ['--window', '0'], ['--sizes', '1333']):
        with pytest.raises(SystemExit):
            tool.parse_args(bad)
    args = tool.parse_args(['--quick'])
    rec = tool._run_row(args, 's', (64, 64), 'windowed', 'relative',
                        'float32')
    assert 'relative' in rec['error'][-1] and 'ms' not in rec


def test_train_step_global_twin_with_memory(tmp_path):
    tool = _tool('train_step.py')
    config = 'configs/quickstart/mask-rcnn_vit-tiny-peg_vitdet_synthetic.py'
    out = tmp_path / 'ts.json'
    tool.main([config, '--global-twin', '--memory', '--quick', '--threads',
               '1', '--image-size', '96x64', '--out', str(out)])
    res = json.loads(out.read_text())
    rows = res['rows']
    assert [r['config'] for r in rows] == [config, f'{config} [global]']
    assert res['batch_shapes'] == [[64, 96], [64, 96]]
    for r in rows:
        assert r['peak_mb'] >= r['step_mb'] > 0 and len(r['times_s']) == 2
    assert rows[0]['peak_ratio'] == pytest.approx(1.0)


def test_train_step_amp_twin_options():
    """--amp-twin: after each variant, the same one as tools/train.py
    --amp builds it on a CPU (the AutocastOptimWrapper in bf16)."""
    tool = _tool('train_step.py')
    config = 'configs/quickstart/detr_irpe_r18_synthetic.py'
    rows = tool.variants(tool.parse_args([config, '--amp-twin']))
    assert [r[0] for r in rows] == [config, f'{config} [bf16 autocast]']
    assert rows[0][2] == {}
    assert rows[1][2] == {'optim_wrapper.type': 'AutocastOptimWrapper',
                          'optim_wrapper.dtype': 'bfloat16'}


def test_train_step_windowed_twin_options():
    """--windowed-twin: ViTDet's windows and global blocks on a global CPVT
    config, its class token dropped (windows refuse one); windowed configs
    get none, and the quarters of other depths give the global blocks."""
    tool = _tool('train_step.py')
    deit = 'configs/mask-rcnn_deit-s-irpe_fpn_1x_coco.py'
    vitdet = 'configs/quickstart/mask-rcnn_vit-tiny-peg_vitdet_synthetic.py'
    args = tool.parse_args([deit, vitdet, '--windowed-twin'])
    rows = tool.variants(args)
    assert [r[0] for r in rows] == [
        deit, f'{deit} [windowed, no class token]', vitdet
    ]
    assert rows[1][2] == {
        'model.backbone.window_size': 14,
        'model.backbone.global_blocks': (2, 5, 8, 11),
        'model.backbone.use_cls_token': False
    }
    assert tool.vitdet_global_blocks(24) == (5, 11, 17, 23)
    assert tool.vitdet_global_blocks(4) == (0, 1, 2, 3)
