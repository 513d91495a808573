"""Smoke tests of tools/benchmark/compiled.py (eager against torch.compile,
issue 17): a quick run's JSON, the grid-from-shape wrapper, bad seeds."""
import importlib.util
import json
import os.path as osp

import pytest
import torch
from mmcv.cnn.bricks.transformer import MultiheadAttention
from torch import nn

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))


def _tool():
    path = osp.join(ROOT, 'tools', 'benchmark', 'compiled.py')
    spec = importlib.util.spec_from_file_location(
        'mmpe_tool_benchmark_compiled', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compiled_benchmark_quick_json(tmp_path):
    tool = _tool()
    out = tmp_path / 'compiled.json'
    # backend 'eager': dynamo traces, the graphs run the same kernels
    tool.main([
        '--quick', '--threads', '1', '--backend', 'eager', '--parts',
        'layer', 'encoder', '--variants', 'RoPE', '--out',
        str(out)
    ])
    res = json.loads(out.read_text())
    assert res['env']['torch'] == torch.__version__
    assert res['env']['threads'] == 1
    assert len(res['env']['load_avg_start']) == 3
    assert len(res['env']['load_avg_end']) == 3
    assert res['args']['grid'] == '4x5' and res['args']['backend'] == 'eager'
    variants = [tool.BASELINE, tool.CTX, 'mmpe RoPE-Mixed']
    for level in ('layer', 'encoder'):
        rows = res[level]['rows']
        assert [(r['variant'], r['mode']) for r in rows] == [
            (v, m) for v in variants for m in tool.MODES
        ]
        by = {r['name']: r for r in rows}
        base = by[tool.row_name(tool.BASELINE, level, 'compiled')]
        assert base['fwd_bwd_time_ratio'] == pytest.approx(1.0)
        assert base['fwd_time_ratio'] == pytest.approx(1.0)
        for r in rows:
            assert len(r['fwd_bwd_ms_all']) == res['args']['rounds']
            assert r['fwd_bwd_ms'] > 0 and r['fwd_ms'] > 0
            assert r['first_fwd_bwd_s'] > 0 and r['first_fwd_s'] > 0
            if r['mode'] == 'eager':
                assert r['graphs'] == 0
                assert r['fwd_bwd_compiled_over_eager'] is None
                continue
            eager = by[tool.row_name(r['variant'], level, 'eager')]
            assert r['fwd_bwd_compiled_over_eager'] == pytest.approx(
                r['fwd_bwd_ms'] / eager['fwd_bwd_ms'])
            # the compiled output is the eager module's
            assert r['max_abs_diff_vs_eager'] < 1e-5
            if r['variant'] != tool.BASELINE:
                # mmpe: one graph with grad, one without, no break
                assert (r['graphs'], r['graph_breaks']) == (2, 0), r['name']
        aims = res[level]['aims']
        ctx_c = by[tool.row_name(tool.CTX, level, 'compiled')]
        fast = aims['compiled_faster_than_eager']
        assert fast['compiled_ms'] == ctx_c['fwd_bwd_ms']
        assert fast['met'] == (fast['ratio'] < 1)
        assert len(fast['round_ratios']) == res['args']['rounds']
        near = aims['within_of_compiled_mha']
        assert near['ratio'] == pytest.approx(ctx_c['fwd_bwd_time_ratio'])
        assert near['met'] == (near['ratio'] <= tool.AIM_VS_MHA)


class _Spy(torch.nn.Module):
    """Records what GridCall hands an attention / encoder."""

    def forward(self, query, query_pos=None, key_padding_mask=None,
                **kwargs):
        self.seen = (query, query_pos, key_padding_mask, kwargs)
        return query


def test_grid_call_hands_tokens_and_the_maps_grid():
    tool = _tool()
    s = tool.GridInputs(2, (3, 5), 8, 0.4, torch.device('cpu'))
    tokens = tool.bench.Inputs(2, (3, 5), 8, 0.4, torch.device('cpu'))
    spy = _Spy()
    for spatial in (True, False):
        out = tool.GridCall(spy, spatial)(s.x, s.pos, s.mask)
        query, pos, mask, kwargs = spy.seen
        # the same tokens, positions and mask as attention.py's Inputs
        torch.testing.assert_close(query, tokens.x, rtol=0, atol=0)
        torch.testing.assert_close(pos, tokens.pos, rtol=0, atol=0)
        assert torch.equal(mask, tokens.mask) and mask[1].any()
        assert kwargs == (dict(spatial_shape=(3, 5)) if spatial else {})
        assert out.shape == s.grad.shape


def _dropout_probs(module):
    """Every dropout probability in ``module``: nn.Dropout layers and
    nn.MultiheadAttention's own ``dropout`` on the probabilities."""
    return ([m.p for m in module.modules() if isinstance(m, nn.Dropout)] +
            [m.dropout for m in module.modules()
             if isinstance(m, nn.MultiheadAttention)])


@pytest.mark.parametrize('level', ['layer', 'encoder'])
def test_rows_keep_their_dropout_after_a_detr_is_built(level):
    """mmcv 2.1.0's MultiheadAttention writes the deprecated ``dropout`` of
    any call (mmdet's DETR configs pass ``dropout=0.1``) into its default
    ``dropout_layer``. The tool's layers give theirs, so a DETR built earlier
    in the process leaves the baseline at ``--dropout`` (without: the
    compiled baseline drew other dropout than its eager twin, 0.72 apart, in
    a shuffled suite)."""
    MultiheadAttention(8, 2, dropout=0.1)  # as building mmdet's DETR does
    assert MultiheadAttention(8, 2).dropout_layer.p == 0.1  # mmcv's default
    tool = _tool()
    args = tool.parse_args(['--quick'])
    assert args.dropout == 0.0
    for variant in (tool.BASELINE, tool.CTX):
        torch.manual_seed(0)
        call = tool.GridCall(
            tool._module(variant, level, args), variant != tool.BASELINE)
        probs = _dropout_probs(call)
        assert probs and set(probs) == {0.0}, (variant, probs)
        # training mode, two calls from other generator states: no dropout
        s = tool.GridInputs(2, (4, 5), args.dims, 0.4, torch.device('cpu'))
        outs = []
        for seed in (1, 2):
            torch.manual_seed(seed)
            outs.append(call(s.x, s.pos, s.mask))
        torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_rows_leave_mmcv_default_dropout_alone():
    """The tool's own ``--dropout`` goes to its layers only: mmcv's default
    ``dropout_layer`` stays Dropout(0) (the conftest gives it back before
    each test)."""
    tool = _tool()
    args = tool.parse_args(['--quick', '--dropout', '0.2'])
    for level in ('layer', 'encoder'):
        for variant in (tool.BASELINE, tool.CTX):
            module = tool._module(variant, level, args)
            assert 0.2 in _dropout_probs(module), (level, variant)
    assert MultiheadAttention(8, 2).dropout_layer.p == 0.0


def test_train_step_seeds_of_one_size_are_refused():
    tool = _tool()
    args = tool.parse_args(
        ['--quick', '--parts', 'train_step', '--train-seeds', '3', '3'])
    with pytest.raises(ValueError, match=r'`--train-seeds` \[3, 3\]'):
        tool.train_step_part(args, torch.device('cpu'))


@pytest.mark.slow
def test_compiled_benchmark_train_step_json(tmp_path):
    """Dynamo traces the whole quick-start train step (minutes on 2 busy
    cores even with backend 'eager')."""
    tool = _tool()
    out = tmp_path / 'compiled_train_step.json'
    tool.main([
        '--quick', '--threads', '1', '--backend', 'eager', '--parts',
        'train_step', '--out',
        str(out)
    ])
    res = json.loads(out.read_text())['train_step']
    assert osp.basename(res['config']) == 'detr_irpe_r18_synthetic.py'
    assert res['padded_sizes'][0] != res['padded_sizes'][1]
    eager, compiled = res['rows']
    assert eager['mode'] == 'eager'
    assert compiled['mode'] == ('compiled'
                                if res['mmengine_compile_error'] is None else
                                'compiled (suppress_errors)')
    assert eager['compiled_over_eager'] == [1.0, 1.0]
    for row in res['rows']:
        assert len(row['first_step_s']) == 2
        assert [len(ts) for ts in row['steps_s']] == [1, 1]
    assert res['graphs'] >= 1
