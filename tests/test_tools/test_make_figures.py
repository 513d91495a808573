"""tools/analysis/make_figures.py: the numbers it draws are the published
ones, and it draws every figure whose input exists.

The expected numbers are read from the published tables (docs/results.md,
docs/benchmark.md), not from the data files, so a transcription error or a
figure that recomputed a mean differently fails here.
"""
import json
import os.path as osp

import numpy as np
import pytest

from test_benchmark_and_visualisers import _tool as _script

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
DATA = osp.join(ROOT, 'docs', 'data')


make_figures = _script('analysis', 'make_figures.py')
figure_io = _script('analysis', 'figure_io.py')  # the data rows it reads


def published_table(page: str, after: str) -> dict:
    """The first Markdown table after the line starting with ``after``:
    {first cell: [other cells]}, bold marks removed."""
    with open(osp.join(ROOT, 'docs', page)) as f:
        lines = f.read().split('\n')
    start = next(i for i, line in enumerate(lines) if line.startswith(after))
    rows, seen = {}, False
    for line in lines[start + 1:]:
        if line.startswith('|'):
            seen = True
            cells = [c.strip().replace('**', '') for c in line.strip('|')
                     .split('|')]
            if not set(cells[1]) <= set('-: '):
                rows[cells[0]] = cells[1:]
        elif seen:
            break
    return rows


def mean_std(cell: str):
    mean, std = cell.split('±')
    return float(mean), float(std)


def decimals(cell: str) -> int:
    return len(cell.split('±')[0].strip().split('.')[1])


SCALE_TABLES = [
    ('encoder_pe_scales.json', 0, 'results.md', '| DETR, 8 epochs | x1'),
    ('encoder_pe_scales.json', 1, 'results.md',
     '| Conditional DETR, 4 epochs | x1'),
    ('seg_scales.json', 0, 'results.md',
     "#### cpvt_seg at the demo's 1500 iterations"),
    ('seg_scales.json', 1, 'results.md',
     '#### cpvt_seg_shape (seeds [0, 1, 2], iterations [1500])'),
]


@pytest.mark.parametrize('name,panel,page,after', SCALE_TABLES)
def test_scale_figures_draw_the_published_means(name, panel, page, after):
    with open(osp.join(DATA, name)) as f:
        rows = json.load(f)['panels'][panel]['rows']
    # a table found by its header row, or the first after a heading
    table = (_table_from_header(page, after) if after.startswith('|') else
             published_table(page, after))
    for row in rows:
        cells = table[row['name']]
        mean, std = figure_io.row_stats(row)
        for i in range(3):  # x1, x1.5, x2
            want_mean, want_std = mean_std(cells[i])
            places = decimals(cells[i])
            assert round(float(mean[i]), places) == pytest.approx(
                want_mean), (row['name'], i)
            assert round(float(std[i]), places) == pytest.approx(
                want_std), (row['name'], i)


def _table_from_header(page: str, header_start: str) -> dict:
    """Like :func:`published_table`, for a table found by its header row."""
    with open(osp.join(ROOT, 'docs', page)) as f:
        lines = f.read().split('\n')
    start = next(i for i, line in enumerate(lines)
                 if line.startswith(header_start))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith('|'):
            break
        cells = [c.strip().replace('**', '') for c in line.strip('|')
                 .split('|')]
        rows[cells[0]] = cells[1:]
    return rows


def test_attention_figure_draws_the_published_benchmark():
    with open(osp.join(DATA, 'attention_grids.json')) as f:
        data = json.load(f)
    main = published_table(
        'benchmark.md', '## One self-attention layer, 25x42 (L = 1050)')
    for row in data['rows']:
        for g, grid in enumerate(data['grids']):
            if grid == '25x42':
                cells = main[row['name'] if row['name'] != 'mmcv MHA' else
                             'mmcv MHA (baseline)']
            else:
                cells = next(v for k, v in _rows_by_grid(grid)
                             if k == row['name'])
            ms, x, peak = cells[0], cells[1], cells[2]  # fwd+bwd ms, x, MiB
            assert row['fwd_bwd_ms'][g] == float(ms), (row['name'], grid)
            assert row['x'][g] == float(x), (row['name'], grid)
            assert row['peak_mb'][g] == float(peak), (row['name'], grid)


def test_attention_long_figure_draws_the_published_tables():
    """docs/data/attention_long.json is the run the long-sequence tables of
    docs/benchmark.md print (ms, ratio to the fused path, tensor peak)."""
    with open(osp.join(DATA, 'attention_long.json')) as f:
        data = json.load(f)
    heads = {'vit-s': '6 x 64', 'detr': '8 x 32'}
    assert {(g['length'], g['cfg']) for g in data['groups']} == {
        (n, c) for n in (1050, 4096, 8192) for c in heads}
    for g in data['groups']:
        h, w = g['grid']
        table = published_table(
            'benchmark.md', f"**L = {g['length']} ({h} x {w}), {g['cfg']} "
            f"heads ({heads[g['cfg']]}), batch {g['batch']}**")
        table.pop('row')  # the header
        assert list(table) == [r['name'] for r in g['rows']]
        for r in g['rows']:
            ms, x, _, peak = table[r['name']][:4]
            assert round(r['fwd_bwd_ms']) == int(ms), r['name']
            assert f"{r['x']:.2f}" == x and round(r['peak_mb']) == int(peak)


def _rows_by_grid(grid: str):
    # the grids table's first cell is the grid, the second the row name
    with open(osp.join(ROOT, 'docs', 'benchmark.md')) as f:
        for line in f:
            if line.startswith(f'| {grid} |'):
                cells = [c.strip() for c in line.strip().strip('|')
                         .split('|')]
                yield cells[1], cells[2:]


def test_demo_curves_are_the_published_seed_table():
    with open(osp.join(DATA, 'demo_curves.json')) as f:
        seeds = json.load(f)['make_demo_seeds']['bbox_mAP_50']
    table = _table_from_header('results.md', '| seed | AP50 by epoch |')
    for seed in (0, 1, 2):
        want = [float(v) for v in table[str(seed)][0].split(' / ')]
        assert seeds[f'seed {seed}'] == want


def test_row_stats_is_the_sample_std_over_seeds():
    row = {'seeds': [[1.0, 10.0], [2.0, 10.0], [4.0, 13.0]]}
    mean, std = figure_io.row_stats(row)
    # sample std: n - 1 in the denominator, written out
    assert mean.tolist() == pytest.approx([7 / 3, 11.0])
    assert std.tolist() == pytest.approx(
        [np.sqrt(((1 - 7 / 3)**2 + (2 - 7 / 3)**2 + (4 - 7 / 3)**2) / 2),
         np.sqrt(3.0)])
    mean, std = figure_io.row_stats({'mean': [0.5], 'std': [0.1]})
    assert mean.tolist() == [0.5] and std.tolist() == [0.1]


def test_draws_every_data_figure_and_skips_missing_inputs(tmp_path):
    names = ['demo_curves', 'encoder_pe_scales', 'seg_scales',
             'attention_vs_length', 'attention_long', 'demo_loss',
             'irpe_buckets', 'decoder_rpb']
    written = make_figures.main(['--out-dir', str(tmp_path), '--only',
                                 *names])
    assert sorted(osp.basename(p) for p in written) == sorted(
        f'{n}.png' for n in names)
    for path in written:
        with open(path, 'rb') as f:
            assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    # no data: nothing drawn, nothing raised; no checkpoint: no map
    empty = tmp_path / 'empty'
    empty.mkdir()
    assert make_figures.main([
        '--data-dir', str(empty), '--out-dir', str(tmp_path / 'out'),
        '--only', 'seg_scales', 'demo_loss', 'rpe_attention'
    ]) == []


def test_decoder_rpb_data_from_the_study_json(tmp_path):
    """--decoder-rpb-runs writes each run's validation AP50 by epoch, rows
    in the study's order and seeds ascending, and the figure is drawn."""
    def run(study, row, seed, curve):
        return dict(study=study, row=row, seed=seed, epochs=len(curve),
                    val_curve=dict(epochs=list(range(1, len(curve) + 1)),
                                   bbox_mAP=[v / 4 for v in curve],
                                   bbox_mAP_50=curve))
    runs = [
        run('decoder_rpb_dab', 'DAB-DETR sine + BoxRPB', 1, [0.2, 0.4]),
        run('decoder_rpb_dab', 'DAB-DETR sine', 0, [0.1, 0.3]),
        run('decoder_rpb_dab', 'DAB-DETR sine + BoxRPB', 0, [0.2, 0.5]),
        run('decoder_rpb_cond', 'Cond. DETR sine + point-RPB', 0,
            [0.3, 0.6]),
        run('encoder_pe_detr', 'DETR sine', 0, [0.0, 0.0]),  # not drawn
    ]
    path = tmp_path / 'runs.json'
    path.write_text(json.dumps(runs))
    data_dir = tmp_path / 'data'
    data_dir.mkdir()
    written = make_figures.main([
        '--data-dir', str(data_dir), '--out-dir', str(tmp_path), '--only',
        'decoder_rpb', '--decoder-rpb-runs', str(path),
        '--decoder-rpb-note', json.dumps({'date': '2026-01-01'})])
    assert [osp.basename(p) for p in written] == ['decoder_rpb.png']
    data = json.loads((data_dir / 'decoder_rpb.json').read_text())
    assert data['source']['date'] == '2026-01-01'
    dab, cond = data['panels']
    assert dab['epochs'] == [1, 2] and dab['title'].startswith('DAB-DETR')
    assert [(r['name'], r['bias'], r['seed_ids'], r['seeds'])
            for r in dab['rows']] == [
        ('DAB-DETR sine', False, [0], [[0.1, 0.3]]),
        ('DAB-DETR sine + BoxRPB', True, [0, 1], [[0.2, 0.5], [0.2, 0.4]])]
    assert [r['name'] for r in cond['rows']] == [
        'Cond. DETR sine + point-RPB']
    mean, std = figure_io.row_stats(dab['rows'][1])
    assert mean.tolist() == pytest.approx([0.2, 0.45])
    assert std.tolist() == pytest.approx([0.0, np.sqrt(0.005)])


@pytest.mark.parametrize('panel,header', [
    (0, '| DAB-DETR, validation AP50 by epoch |'),
    (1, '| Conditional DETR, validation AP50 by epoch |')])
def test_decoder_rpb_figure_draws_the_published_curves(panel, header):
    """docs/data/decoder_rpb.json holds the runs whose means (± sample std
    over seeds; one seed: the value) docs/results.md prints by epoch."""
    with open(osp.join(DATA, 'decoder_rpb.json')) as f:
        data = json.load(f)['panels'][panel]
    table = _table_from_header('results.md', header)
    assert list(table) == [row['name'] for row in data['rows']]
    for row in data['rows']:
        cells = table[row['name']]
        assert len(cells) == len(data['epochs'])
        mean, std = figure_io.row_stats(row)
        for i, cell in enumerate(cells):
            if len(row['seeds']) > 1:
                want_mean, want_std = mean_std(cell)
            else:
                want_mean, want_std = float(cell), 0.0
            places = len(cell.split('±')[0].strip().split('.')[1])
            assert round(float(mean[i]), places) == pytest.approx(
                want_mean), (row['name'], i)
            assert round(float(std[i]), places) == pytest.approx(
                want_std), (row['name'], i)
