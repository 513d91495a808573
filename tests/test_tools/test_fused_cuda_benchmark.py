"""tools/benchmark/fused_cuda.py (the aims of the fused kernel on CUDA) as a
smoke test on CPU: a tiny length in a subprocess, the JSON's structure, the
ratios to SDPA and the met flags against the aims' limit. No timing is
asserted."""
import json
import math
import os
import subprocess
import sys

import torch
from test_benchmark_and_visualisers import _tool

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
SETTINGS = ['ctx product k', 'ctx product qk', 'rel-pos', 'bias product k',
            'log-cpb', 'alibi-2d']


def _positive(v):
    return isinstance(v, float) and math.isfinite(v) and v > 0


def test_cpu_run_json_and_report(tmp_path):
    out, report = tmp_path / 'fused.json', tmp_path / 'fused.md'
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'tools', 'benchmark',
                                      'fused_cuda.py'),
         '--device', 'cpu', '--lengths', '24', '--rounds', '1',
         '--warmup', '1', '--threads', '1', '--out', str(out),
         '--report', str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    env = res['env']
    assert env['device'] == 'cpu' and env['threads'] == 1
    assert 'torch' in env and 'triton' in env and 'cuda' in env
    assert res['aims'] == {'time': 1.3, 'peak': 1.3}
    records = res['records']
    # every (heads, dtype, setting), in the tool's order; 24 = 4 x 6
    assert [(r['heads'], r['dtype'], r['setting']) for r in records] == [
        (h, d, s) for h in ('vit-s', 'detr') for d in ('float32', 'bfloat16')
        for s in SETTINGS]
    for r in records:
        assert r['length'] == 24 and r['grid'] == [4, 6] and r['batch'] == 2
        assert (r['num_heads'], r['head_dim']) == (
            (6, 64) if r['heads'] == 'vit-s' else (8, 32))
        for col in ('sdpa', 'fused', 'explicit'):
            assert _positive(r[col]['ms']) and len(r[col]['ms_all']) == 1
            assert _positive(r[col]['peak_mb']) and r[col]['error'] is None
        # the C++ kernel ran every setting here (no fallback)
        assert r['fused_backend'] == 'fused-cpu' and not r['fell_back']
        for key in ('time', 'peak'):
            ratio = r['ratios'][key]
            assert _positive(ratio)
            col = 'ms' if key == 'time' else 'peak_mb'
            assert math.isclose(ratio, r['fused'][col] / r['sdpa'][col])
            assert math.isclose(r['explicit_ratios'][key],
                                r['explicit'][col] / r['sdpa'][col])
            assert r['met'][key] == (ratio <= 1.3)
    # one SDPA reference per (heads, dtype), shared by its settings
    by = {}
    for r in records:
        by.setdefault((r['heads'], r['dtype']), set()).add(r['sdpa']['ms'])
    assert all(len(v) == 1 for v in by.values())
    text = report.read_text()
    lines = [line for line in text.splitlines() if line.startswith('| 24 ')]
    assert len(lines) == len(records)
    assert 'triton ' + str(env['triton']) in text


def test_grid_of_and_bad_arguments():
    tool = _tool('benchmark', 'fused_cuda.py')
    assert tool.grid_of(1050) == (25, 42) and tool.grid_of(8192) == (64, 128)
    assert tool.grid_of(24) == (4, 6) and tool.grid_of(7) == (1, 7)
    assert tool.batch_of(1050, None) == 2 and tool.batch_of(4096, None) == 1
    for argv in (['--lengths', '0'], ['--rounds', '0'],
                 ['--settings', 'nope']):
        try:
            tool.parse_args(argv)
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f'{argv} accepted')


def test_a_row_that_raises_is_reported_not_fatal():
    """A column that raises (e.g. out of memory on a GPU) keeps its error;
    the other columns are measured and its aims are not met."""
    tool = _tool('benchmark', 'fused_cuda.py')
    bench_measure = _tool('benchmark', 'bench_measure.py')
    device = torch.device('cpu')

    def fails(module, x, s):
        raise RuntimeError('CUDA out of memory (a stand-in)')

    rows = tool.build_rows(16, 2, (2, 3), ['ctx product k'], device)
    rows[1] = bench_measure.Row('ctx product k (fused)', rows[1].module,
                                fails, True, False)
    s = tool.make_inputs(1, 2, 8, (2, 3), torch.float32, device)
    meas = tool.measure_group(rows, s, 1, 1, device)
    assert meas['ctx product k (fused)']['error'] == (
        'RuntimeError: CUDA out of memory (a stand-in)')
    assert meas['ctx product k (fused)']['ms'] is None
    for name in ('sdpa', 'ctx product k (explicit)'):
        assert meas[name]['error'] is None and _positive(meas[name]['ms'])
    head = dict(length=6, grid=[2, 3], batch=1, heads='detr', num_heads=2,
                head_dim=8, dtype='float32')
    rec, = tool.setting_records(meas, ['ctx product k'], 'fused-cpu', head)
    assert rec['met'] == {'time': False, 'peak': False}
    assert rec['ratios'] == {'time': None, 'peak': None}
    assert tool.table_line(rec).count('no (error)') == 2
