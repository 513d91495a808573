"""Smoke tests of the benchmarks (tools/benchmark) and the iRPE visualisers
(tools/analysis): small runs, JSON fields, non-empty PNGs."""
import importlib.util
import json
import os.path as osp

import mmcv
import numpy as np
import pytest
import torch

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
CONFIG = osp.join(ROOT, 'configs', 'quickstart', 'detr_irpe_r18_synthetic.py')
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def _tool(*parts):
    """Import a script under tools/ as a module (the modules beside it
    import as ``python tools/...`` would find them: pytest.ini's
    ``pythonpath`` names their folders)."""
    path = osp.join(ROOT, 'tools', *parts)
    spec = importlib.util.spec_from_file_location(
        'mmpe_tool_' + '_'.join(parts).replace('.py', ''), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _assert_png(path):
    assert osp.isfile(path), path
    with open(path, 'rb') as f:
        head = f.read(8)
    assert head == PNG_MAGIC and osp.getsize(path) > 1000, path


@pytest.mark.parametrize('extra', [[], ['--index', 'clip', '--ref', '0', '6']])
def test_visualize_buckets_writes_pngs(tmp_path, extra):
    tool = _tool('analysis', 'visualize_buckets.py')
    paths = tool.main(['--grid', '5x7', '--out-dir', str(tmp_path), '--dpi',
                       '40'] + extra)
    assert [osp.basename(p) for p in paths] == [
        f'buckets_{"clip" if extra else "piecewise"}.png',
        'index_functions.png'
    ]
    for p in paths:
        _assert_png(p)


def test_bucket_maps_are_the_modules_ids():
    from mmpe.models.layers import iRPE
    tool = _tool('analysis', 'visualize_buckets.py')
    maps = dict(tool.bucket_maps(5, 7, (2, 3), 'piecewise', 1.0, None))
    assert len(maps) == 5
    i = 2 * 7 + 3
    for method in ('euclidean', 'quant', 'product'):
        rpe = iRPE(4, 1, method=method, ratio=1.0)
        title = f'{method} ({rpe.num_buckets} buckets)'
        want = rpe.bucket_ids(5, 7)[i].view(5, 7).numpy()
        np.testing.assert_array_equal(maps[title], want)
    # ratio 1 -> b = 2: the query's own bucket is the centre (2, 2)
    assert maps['product (25 buckets)'][2, 3] == 2 * 5 + 2
    assert (maps['cross, rows (5 buckets)'][2] == 2).all()
    assert (maps['cross, columns (5 buckets)'][:, 3] == 2).all()


def _image(path, h=72, w=104):
    img = np.full((h, w, 3), 30, np.uint8)
    img[10:40, 20:60] = (0, 0, 220)
    mmcv.imwrite(img, str(path))
    return str(path)


@pytest.mark.parametrize('with_ckpt', [False, True])
def test_visualize_rpe_attention_writes_png(tmp_path, with_ckpt):
    from mmdet.registry import MODELS
    from mmengine.config import Config
    tool = _tool('analysis', 'visualize_rpe_attention.py')
    args = [CONFIG]
    if with_ckpt:  # a checkpoint as mmengine saves it
        model = MODELS.build(Config.fromfile(CONFIG).model)
        ckpt = str(tmp_path / 'epoch_1.pth')
        torch.save(dict(meta=dict(epoch=1), state_dict=model.state_dict()),
                   ckpt)
        args.append(ckpt)
    out = tool.main(args + [
        '--img', _image(tmp_path / 'img.png'), '--point', '30', '20',
        '--out', str(tmp_path / 'attn.png'), '--dpi', '40'
    ])
    _assert_png(out)


@pytest.mark.parametrize('init', ['zeros', 'xavier'])
def test_rpe_attention_maps(tmp_path, init):
    from mmdet.registry import MODELS
    from mmengine.config import Config

    from mmpe.models.layers import iRPE
    tool = _tool('analysis', 'visualize_rpe_attention.py')
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(CONFIG).model)
    model.init_weights()
    for m in model.modules():
        if isinstance(m, iRPE):
            m.init = init
            m.reset_table()
    model.eval()
    img = mmcv.imread(_image(tmp_path / 'img.png'))
    inputs, samples = tool.prepare(model, img)
    maps = tool.rpe_attention_maps(model, inputs, samples, (30.0, 20.0))
    assert len(maps['diff']) == len(model.encoder.layers)
    for diff, with_rpe in zip(maps['diff'], maps['with_rpe']):
        assert diff.shape == maps['grid'] == with_rpe.shape
        # both are distributions over the keys: the difference sums to 0
        assert abs(diff.sum()) < 1e-5 and abs(with_rpe.sum() - 1) < 1e-5
        if init == 'zeros':  # zero tables add nothing
            assert np.abs(diff).max() == 0
        else:
            assert np.abs(diff).max() > 0


def test_attention_benchmark_quick_json(tmp_path):
    tool = _tool('benchmark', 'attention.py')
    rows_lib = _tool('benchmark', 'attention_rows.py')
    out = tmp_path / 'bench.json'
    tool.main(['--quick', '--threads', '1', '--out', str(out)])
    res = json.loads(out.read_text())
    assert res['env']['torch'] == torch.__version__
    assert res['env']['threads'] == 1 and len(res['env']['load_avg_end']) == 3
    grid = res['grids']['6x8']
    names = [r['name'] for r in grid['layer']]
    assert names[0] == rows_lib.BASELINE and rows_lib.EQ27 in names
    assert 'mmpe ctx product k' in names and 'mmpe bias product k' in names
    assert {'mmpe no RPE (sdpa)', 'mmpe bias product k (sdpa)',
            'mmpe ctx product k (sdpa)', *rows_lib.SOFTMAX_B} <= set(names)
    assert 'mmpe ctx product k encoder (sdpa)' in [
        r['name'] for r in grid['encoder']
    ]
    for group in ('layer', 'encoder'):
        rows = grid[group]
        for key in ('fwd_bwd_time_ratio', 'fwd_time_ratio',
                    'fwd_bwd_mem_ratio', 'fwd_mem_ratio'):
            assert rows[0][key] == pytest.approx(1.0)  # the baseline
            for r in rows:
                if key.startswith('fwd_') and not key.startswith(
                        'fwd_bwd') and r['name'] in rows_lib.SOFTMAX_B:
                    # the A/B rows time fwd+bwd only
                    assert r[key] is None, (r['name'], key)
                    continue
                assert r[key] is not None and r[key] > 0, (r['name'], key)
        for r in rows:
            assert len(r['fwd_bwd_ms_all']) == res['args']['rounds']
    assert set(grid['targets']) == {
        'ctx_product_k_time', 'ctx_product_k_memory', 'bias_time',
        'eq27_speedup'
    }
    ab = grid['softmax_ab']
    assert set(ab) == {*rows_lib.SOFTMAX_B, 'keep_private_aten'}
    for name in rows_lib.SOFTMAX_B:
        assert ab[name]['ratio'] > 0
        assert len(ab[name]['round_ratios']) == res['args']['rounds']


@pytest.mark.parametrize('add_', [False, True])
def test_attention_benchmark_plain_softmax_is_the_same_layer(add_):
    """The A/B's plain variant computes what the in-place softmax does
    (forward and backward), and only inside its block."""
    from mmpe.models.layers import PEMultiheadAttention
    from mmpe.models.layers.attention import ops as attention_ops
    tool = _tool('benchmark', 'attention_rows.py')
    torch.manual_seed(0)
    layer = PEMultiheadAttention(
        16, 2, batch_first=True, rpe_cfg=tool._rpe_cfg('ctx', 'product'),
        rpe_on='k', attn_impl='explicit')
    x = torch.randn(2, 12, 16)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[1, -3:] = True
    grad = torch.randn(2, 12, 16)

    def run():
        xg = x.clone().requires_grad_()
        layer.zero_grad()
        out = layer(xg, key_padding_mask=mask, spatial_shape=(3, 4))
        out.backward(grad)
        return out.detach(), xg.grad, layer.rpe_k.table.grad.clone()

    original = attention_ops.masked_softmax
    want = run()
    with tool.plain_softmax(add_):
        assert attention_ops.masked_softmax is not original
        got = run()
    assert attention_ops.masked_softmax is original
    for g, w in zip(got, want):
        # same float32 arithmetic up to the softmax's rounding
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_attention_benchmark_offset_bias_rows():
    """The offset-bias rows (issue 47): each bias on the backend its name
    says, beside iRPE's product bias whose clip distance covers the largest
    grid; a run of the filtered rows reports every one."""
    from mmpe.models.layers import OffsetBias
    tool = _tool('benchmark', 'attention.py')
    rows_lib = _tool('benchmark', 'attention_rows.py')
    args = tool.parse_args(['--grids', '3x5', '4x6', '--dims', '32',
                            '--heads', '4'])
    rows = rows_lib.offset_bias_rows(args, None)
    names = [r[0] for r in rows]
    # each table shared by every query on the dense and the fused backend
    # (iRPE's product bias also with its piecewise index), then the offset
    # biases through 'auto' (issue 52: the rule's rows)
    assert names == [f'mmpe {n} ({impl})' for impl in ('explicit', 'fused')
                     for n in ('bias product k clip-grid', 'bias product k',
                               *rows_lib.OFFSET_BIASES)] + [
                                   f'mmpe {n} (auto)'
                                   for n in rows_lib.OFFSET_BIASES]
    for name, module, *_ in rows:
        assert module.attn_impl == name.split('(')[-1][:-1]
        if 'bias product k' in name:
            assert module.rpe_k.mode == 'bias'
            clip = 'clip-grid' in name
            assert module.rpe_k.index == ('clip' if clip else 'piecewise')
            if clip:
                assert module.rpe_k.bucket_spec.max_distance == 5  # 6 - 1
        else:
            assert isinstance(module.grid_bias, OffsetBias)
            assert module.grid_bias.num_heads == 4
    res = tool.main(['--quick', '--threads', '1', '--variants',
                     'log-cpb|alibi-2d|lookhere|clip-grid', '--no-encoder',
                     '--no-memory'])
    got = [r['name'] for r in res['grids']['6x8']['layer']]
    shown = ('mmpe log-cpb', 'mmpe alibi-2d', 'mmpe lookhere',
             'mmpe bias product k clip-grid')  # the --variants filter
    assert got == [rows_lib.BASELINE] + [
        n for n in names if n.startswith(shown)]
    assert all(r['fwd_bwd_time_ratio'] > 0
               for r in res['grids']['6x8']['layer'])


def test_train_step_benchmark_quick_json(tmp_path):
    tool = _tool('benchmark', 'train_step.py')
    out = tmp_path / 'train_step.json'
    tool.main(['--quick', '--threads', '1', '--out', str(out)])
    res = json.loads(out.read_text())
    rows = res['rows']
    assert [osp.basename(r['config']) for r in rows] == [
        'detr_r18_synthetic.py', 'detr_irpe_r18_synthetic.py'
    ]
    assert rows[0]['ratio'] == pytest.approx(1.0)
    assert rows[1]['ratio'] > 0 and len(rows[1]['times_s']) == 2
    # the iRPE twin adds only the RPE tables
    assert rows[1]['params'] > rows[0]['params']
