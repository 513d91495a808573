"""Smoke tests of the long-sequence part of tools/benchmark/attention.py
(``--long``): the rows, ratios and aims of a tiny run, and one peak-memory
row in its own process. No timing is asserted."""
import json

import pytest
import torch

from test_benchmark_and_visualisers import _tool as _script


def _tool():
    return _script('benchmark', 'attention.py')


def _long():
    return _script('benchmark', 'attention_long.py')


def test_long_benchmark_quick_json(tmp_path):
    tool, long = _tool(), _long()
    out = tmp_path / 'long.json'
    # backend 'eager': dynamo traces (graph breaks counted), no codegen
    tool.main([
        '--long', '--long-grids', '4x6', '--head-cfgs', 'detr', 'vit-s',
        '--rounds', '1', '--backend', 'eager', '--no-memory', '--threads',
        '1', '--out', str(out)
    ])
    res = json.loads(out.read_text())
    assert res['env']['threads'] == 1
    assert [(g['length'], g['cfg']) for g in res['groups']] == [(24, 'detr'),
                                                                (24, 'vit-s')]
    for g in res['groups']:
        names = [r['name'] for r in g['rows']]
        # every variant, the named backends beside the default ('auto')
        assert names == [
            f'{v} {m}' for v in (long.LONG_BASE, long.LONG_CTX,
                                 'mmpe ctx product k (explicit)',
                                 'mmpe ctx product k (chunked)',
                                 'mmpe bias product k', 'mmpe ctx product qkv')
            + (('mmpe rel-pos', ) if g['cfg'] == 'vit-s' else ())
            for m in long.LONG_MODES
        ]
        by = {(r['variant'], r['mode']): r for r in g['rows']}
        for r in g['rows']:
            base = by[(long.LONG_BASE, r['mode'])]
            assert r['x'] == pytest.approx(r['fwd_bwd_ms'] /
                                           base['fwd_bwd_ms'])
            assert len(r['fwd_bwd_ms_all']) == 1 and r['cpu_ms'] > 0
            if r['mode'] == 'compiled':
                eager = by[(r['variant'], 'eager')]
                assert r['c_e'] == pytest.approx(r['fwd_bwd_ms'] /
                                                 eager['fwd_bwd_ms'])
                assert r['graph_breaks'] == 0, r['name']
    # at every length: the time aim of the default iRPE row of each head
    # shape (no memory aim: --no-memory), and compiled < eager of each iRPE
    # row (5 with DETR heads, 6 with ViT-S: rel-pos)
    aims = res['aims']
    time_aims = [a for a in aims if 'time <=' in a['aim']]
    assert [a['aim'] for a in time_aims] == [
        f'L=24 {cfg} time <= {long.LONG_AIMS["time"]}x'
        for cfg in ('detr', 'vit-s')
    ]
    for a in time_aims:
        ctx = next(r for g in res['groups'] for r in g['rows']
                   if a['aim'].startswith(f"L=24 {g['cfg']} ")
                   and r['variant'] == long.LONG_CTX and r['mode'] == 'eager')
        assert a['value'] == ctx['x'] and a['cpu_value'] == ctx['cpu_x']
        assert a['met'] == (max(ctx['x'], ctx['cpu_x']) <=
                            long.LONG_AIMS['time'])
    assert not any('memory' in a['aim'] for a in aims)
    assert sum('compiled < eager' in a['aim'] for a in aims) == 11


def test_memory_row_in_its_own_process():
    long = _long()
    spec = dict(length=24, grid=[4, 6], cfg='detr',
                variant='mmpe ctx product k (chunked)', mode='eager',
                batch=2, pad=0.25, device='cpu', backend='eager', threads=1)
    mem = long._memory_subprocess(spec)
    assert mem['length'] == 24
    assert mem['tensor_peak'] > 0
    assert mem['rss_peak'] is None or mem['rss_peak'] >= 0


def test_explicit_rows_stop_at_the_length_limit():
    """The explicit row's (B, H, L, L) buffers are opt-in above
    --explicit-max-length."""
    tool, long = _tool(), _long()
    args = tool.parse_args(['--long', '--modes', 'eager', '--variants',
                            'ctx product k'])
    rows = long.long_rows((32, 32), 'detr', args, torch.device('cpu'))
    assert [r.variant for r in rows] == [
        long.LONG_BASE, long.LONG_CTX, 'mmpe ctx product k (explicit)',
        'mmpe ctx product k (chunked)'
    ]
    args.explicit_max_length = 1023
    rows = long.long_rows((32, 32), 'detr', args, torch.device('cpu'))
    assert [r.variant for r in rows] == [
        long.LONG_BASE, long.LONG_CTX, 'mmpe ctx product k (chunked)'
    ]
