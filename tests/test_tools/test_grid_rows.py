"""``tools/benchmark/grid_rows.py``: the rows of ``attention.py --out`` runs
gathered into one data file (the form ``tools/analysis/docs_tables.py``
reads): values copied per grid in input order, rows filtered by name, a
row missing from a grid's run left empty, each grid's source named.

Expected values: two runs' JSON written here by hand."""
import json

import grid_rows


def _run(grid, rows, date, load):
    return dict(env=dict(date=date, threads=1, load_avg_start=[load, 0, 0],
                         load_avg_end=[load + 1, 0, 0]),
                grids={grid: dict(layer=[
                    dict(name=name, fwd_bwd_ms=ms, fwd_bwd_peak_mb=mb)
                    for name, ms, mb in rows])})


def test_rows_of_two_runs(tmp_path):
    small = _run('2x3', [('mmcv MHA', 1.04, 2.4), ('a (fused)', 2.06, 1.6),
                         ('a (explicit)', 3.0, 9.5)], 'day-1', 2.0)
    large = _run('4x6', [('mmcv MHA', 10.0, 30.0), ('a (fused)', 20.0, 3.0)],
                 'day-2', 5.0)
    paths = []
    for i, run in enumerate((small, large)):
        paths.append(str(tmp_path / f'run{i}.json'))
        with open(paths[-1], 'w') as f:
            json.dump(run, f)
    out = str(tmp_path / 'data.json')
    grid_rows.main(paths + ['--out', out, '--what', 'w', '--variants',
                            r'\(', '--command-of', '2x3=cmd small',
                            '--machine', 'a VM'])
    with open(out) as f:
        data = json.load(f)
    assert data['grids'] == ['2x3', '4x6'] and data['tokens'] == [6, 24]
    assert data['rows'] == [
        dict(name='a (fused)', fwd_bwd_ms=[2.1, 20.0], peak_mb=[2, 3]),
        dict(name='a (explicit)', fwd_bwd_ms=[3.0, None], peak_mb=[10, None]),
    ]
    assert data['sources']['2x3'] == dict(
        date='day-1', command='cmd small',
        machine='a VM; 1 thread(s), load average 2.0 at the start, 3.0 at '
        'the end')
    assert data['sources']['4x6']['command'] == ''
