"""tools/model_converters/irpe_detr_to_mmpe.py against the iRPE authors' code.

Expected values come from outside the converter: the predictions the
authors' DETR-with-iRPE code recorded in ``tests/data/irpe_authors/``
(its README describes every array), and a slow loop
reference of the authors' attention (Eq. 16-18 with their bucket ids and
table layouts) written below.
"""
import argparse
import importlib.util
import math
import os.path as osp

import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmengine.config import Config

import mmpe  # noqa: F401
from mmpe.models.layers import PEMultiheadAttention

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
FIXTURES = osp.join(ROOT, 'tests', 'data', 'irpe_authors')
SETTINGS = ('rpe-1.9-product-ctx-1-k', 'rpe-1.9-product-bias-1-k')
# the fixture README's tolerance: float32 through 2 encoder + 2 decoder
# layers, the authors' op order differs from mmpe's (one fused matmul vs
# two, softmax of masked logits)
ATOL = 1e-4
# the slow reference runs in float64: only rounding of the float32 model
REF_ATOL = 1e-5
# mmdet's 80 classes + background as columns of DETR's 92 logits, written
# from the fixture README (COCO ids 1-90 without the 10 unused, then 91)
MMDET_COLUMNS = [
    i for i in range(1, 91)
    if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)
] + [91]

spec = importlib.util.spec_from_file_location(
    'irpe_detr_to_mmpe',
    osp.join(ROOT, 'tools', 'model_converters', 'irpe_detr_to_mmpe.py'))
conv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(conv)

def _fixture(setting):
    data = np.load(osp.join(FIXTURES, f'detr_{setting}.npz'))
    # arch: 'd_model=64 nhead=4 ... num_classes=91 (92 logits) ...'
    arch = dict(
        item.split('=', 1) for item in str(data['arch']).split()
        if '=' in item)
    model = {
        k[len('model/'):]: torch.from_numpy(data[k])
        for k in data.files if k.startswith('model/')
    }
    return data, arch, model


def _detr(setting, arch):
    """The mmpe config of this setting with the fixture's sizes."""
    mode = setting.split('-')[3]
    name = 'detr_irpe_ctx_r50_150e.py' if mode == 'ctx' else \
        'detr_irpe_bias_r50_150e.py'
    cfg = Config.fromfile(osp.join(ROOT, 'configs', name)).model
    dims, heads = int(arch['d_model']), int(arch['nhead'])
    ffn = int(arch['dim_feedforward'])
    assert arch['pre_norm'] == 'False'
    assert arch['position_embedding'] == 'sine(normalize=True)'
    cfg.backbone.init_cfg = None  # bypassed: the fixture gives its output
    cfg.neck.in_channels = [int(arch['backbone_channels'])]
    cfg.neck.out_channels = dims
    cfg.num_queries = int(arch['num_queries'])
    cfg.positional_encoding.num_feats = dims // 2
    cfg.encoder.num_layers = int(arch['enc_layers'])
    cfg.decoder.num_layers = int(arch['dec_layers'])
    layers = [cfg.encoder.layer_cfg, cfg.decoder.layer_cfg]
    for attn in (layers[0].self_attn_cfg, layers[1].self_attn_cfg,
                 layers[1].cross_attn_cfg):
        attn.update(embed_dims=dims, num_heads=heads, dropout=0.0)
    for layer in layers:
        layer.ffn_cfg.update(
            embed_dims=dims, feedforward_channels=ffn, ffn_drop=0.0)
    cfg.bbox_head.embed_dims = dims
    model = MODELS.build(cfg)
    model.eval()
    return model


def _load(model, state_dict):
    result = model.load_state_dict(state_dict, strict=False)
    assert not result.unexpected_keys
    assert all(k.startswith('backbone.') for k in result.missing_keys), \
        [k for k in result.missing_keys if not k.startswith('backbone.')]


@pytest.mark.parametrize('batch', ['padded', 'unpadded'])
@pytest.mark.parametrize('setting', SETTINGS)
def test_predictions_match_authors(setting, batch):
    data, arch, authors = _fixture(setting)
    assert str(data['setting']) == setting
    model = _detr(setting, arch)
    _load(model, conv.convert(authors, log=None))

    feat = torch.from_numpy(data[f'{batch}/feat'])
    batch_shape = tuple(int(s) for s in data[f'{batch}/batch_input_shape'])
    samples = [
        DetDataSample(
            metainfo=dict(
                img_shape=tuple(int(s) for s in shape),
                batch_input_shape=batch_shape))
        for shape in data[f'{batch}/img_shapes']
    ]
    with torch.no_grad():
        # backbone bypassed: the neck (the authors' input_proj) onwards
        img_feats = model.neck((feat, ))
        enc_inputs, _ = model.pre_transformer(img_feats, samples)
        head_inputs = model.forward_transformer(img_feats, samples)
        cls_scores, boxes = model.bbox_head(**head_inputs)

    # the padding mask mmdet derives from the image sizes is the authors'
    mask = torch.from_numpy(data[f'{batch}/mask']).flatten(1)
    if enc_inputs['feat_mask'] is None:  # mmdet: no padding in the batch
        assert not mask.any()
    else:
        assert torch.equal(enc_inputs['feat_mask'], mask)

    logits = torch.from_numpy(data[f'{batch}/pred_logits'])
    ref_boxes = torch.from_numpy(data[f'{batch}/pred_boxes'])
    assert cls_scores.shape[0] == logits.shape[0] == int(arch['dec_layers'])
    for layer in range(logits.shape[0]):
        torch.testing.assert_close(
            cls_scores[layer],
            logits[layer][..., MMDET_COLUMNS],
            atol=ATOL,
            rtol=0)
        torch.testing.assert_close(
            boxes[layer], ref_boxes[layer], atol=ATOL, rtol=0)


def test_cli_bias_checkpoint_loads(tmp_path, capsys):
    setting = 'rpe-1.9-product-bias-1-k'
    _, arch, authors = _fixture(setting)
    src, dst = str(tmp_path / 'authors.pth'), str(tmp_path / 'mmpe.pth')
    # as the authors' main.py saves it
    train_args = argparse.Namespace(
        enc_rpe2d=setting,
        nheads=int(arch['nhead']),
        hidden_dim=int(arch['d_model']),
        pre_norm=False,
        masks=False,
        position_embedding='sine',
        dilation=False,
        lr=1e-4)
    torch.save(dict(model=authors, args=train_args, epoch=149), src)
    conv.main([src, dst])
    printed = capsys.readouterr().out
    assert 'encoder layer 0: rpe_k lookup_table_bias' in printed
    assert 'configs/detr_irpe_bias_r50_150e.py' in printed

    ckpt = torch.load(dst, map_location='cpu', weights_only=True)
    model = _detr(setting, arch)
    _load(model, ckpt['state_dict'])
    for layer in range(int(arch['enc_layers'])):
        key = f'transformer.encoder.layers.{layer}.self_attn.rpe_k.'
        rpe = model.encoder.layers[layer].self_attn.rpe_k
        assert rpe.mode == 'bias'
        torch.testing.assert_close(rpe.table.data,
                                   authors[key + 'lookup_table_bias'])


@pytest.mark.parametrize(
    'key,shape',
    [
        ('transformer.encoder.layers.0.self_attn.rpe_k.lookup_table_wieght',
         (1, 8, 49)),
        ('transformer.encoder.layers.0.self_attn.rpe_v.lookup_table_bias',
         (1, 49)),  # the authors' code has no bias on values
        ('transformer.decoder.layers.0.self_attn.rpe_k.lookup_table_bias',
         (1, 49)),  # iRPE is in the encoder only
        ('transformer.encoder.norm.weight', (64, )),  # pre-norm models
        ('backbone.1.row_embed.weight', (50, 32)),  # learned position
        ('class_embed.weight', (91, 64)),  # not the 92-row COCO classifier
        ('transformer.encoder.layers.0.self_attn.rpe_q.rp_rows.'
         'lookup_table_weight', (1, 8, 7)),  # cross without rp_cols
    ])
def test_unplaceable_key_is_an_error(key, shape):
    with pytest.raises(ValueError, match=key.replace('.', r'\.')):
        conv.convert({key: torch.zeros(shape)}, log=None)


def test_setting_contradiction_is_an_error():
    key = 'transformer.encoder.layers.0.self_attn.rpe_k.lookup_table_bias'
    with pytest.raises(ValueError, match='81 buckets expected'):
        conv.convert({key: torch.zeros(1, 49)},
                     enc_rpe2d='rpe-2.0-product-bias-1-k',
                     log=None)


# --- every table layout, against a slow reference of the authors' code ---


def _piecewise(x, ratio):
    """Eq. 18 as the authors' ``piecewise_index`` (float64 here)."""
    alpha, beta, gamma = ratio, 2 * ratio, 8 * ratio
    x = x.double()
    far = x.abs() > alpha
    y = torch.sign(x) * (alpha + torch.log(x.abs().clamp(min=1e-9) / alpha) /
                         math.log(gamma / alpha) *
                         (beta - alpha)).round().clamp(max=beta)
    return torch.where(far, y, x.round()).long()


def _bucket_maps(method, ratio, height, width):
    """The authors' bucket ids, query i minus key j, per table: one map,
    or (rows, cols) for cross; each in [0, 2b] (product [0, (2b+1)^2))."""
    b = int(2 * ratio)
    ys, xs = torch.meshgrid(
        torch.arange(height), torch.arange(width), indexing='ij')
    dy = ys.flatten()[:, None] - ys.flatten()[None]
    dx = xs.flatten()[:, None] - xs.flatten()[None]
    if method == 'product':
        return [(_piecewise(dy, ratio) + b) * (2 * b + 1) +
                _piecewise(dx, ratio) + b]
    if method == 'cross':
        return [_piecewise(dy, ratio) + b, _piecewise(dx, ratio) + b]
    if method == 'euclidean':
        dist = (dy**2 + dx**2).double().sqrt().round()
        return [_piecewise(dist, ratio) + b]
    return [_piecewise(dy**2 + dx**2, ratio) + b]  # quant


def _authors_attention(x, w_in, b_in, w_out, b_out, tables, method, ratio,
                       heads, height, width):
    """The authors' ``rpe_multi_head_attention_forward``, one loop per
    (head, query, key). ``tables[on]`` is a list (cross: rows, cols) of
    authors'-layout tables."""
    n, dims = x.shape[1], x.shape[2]
    hd = dims // heads
    scale = hd**-0.5
    q, k, v = (x @ w_in.t() + b_in).split(dims, dim=-1)
    q = q * scale
    maps = _bucket_maps(method, ratio, height, width)
    out = torch.zeros(x.shape[0], n, dims, dtype=x.dtype)
    for bi in range(x.shape[0]):
        for h in range(heads):
            sl = slice(h * hd, (h + 1) * hd)
            qh, kh, vh = q[bi, :, sl], k[bi, :, sl], v[bi, :, sl]
            logits = qh @ kh.t()
            for i in range(n):
                for j in range(n):
                    for on in ('k', 'q'):
                        for tab, ids in zip(tables.get(on, []), maps):
                            t = tab[h if tab.shape[0] > 1 else 0]
                            # r^K at b(i, j) with q_i; r^Q at b(j, i) with
                            # the scaled key (the authors' transpose)
                            bucket = ids[i, j] if on == 'k' else ids[j, i]
                            if t.dim() == 1:  # bias (H', nb)
                                logits[i, j] += t[bucket]
                            elif on == 'k':  # (head_dim, nb)
                                logits[i, j] += qh[i] @ t[:, bucket]
                            else:
                                logits[i, j] += (kh[j] * scale) @ t[:, bucket]
            attn = logits.softmax(-1)
            out_h = attn @ vh
            for tab, ids in zip(tables.get('v', []), maps):
                t = tab[h if tab.shape[0] > 1 else 0]  # (nb, head_dim)
                for i in range(n):
                    for j in range(n):
                        out_h[i] += attn[i, j] * t[ids[i, j]]
            out[bi, :, sl] = out_h
    return out @ w_out.t() + b_out


LAYOUTS = [
    dict(mode='ctx', method='product', on='qkv', shared=False),
    dict(mode='ctx', method='cross', on='qkv', shared=True),
    dict(mode='bias', method='cross', on='qk', shared=False),
    dict(mode='ctx', method='euc', on='kv', shared=True),
    dict(mode='bias', method='quant', on='q', shared=True),
]


@pytest.mark.parametrize('case', LAYOUTS, ids=lambda c: '-'.join(
    str(v) for v in c.values()))
def test_table_layouts_match_authors_attention(case):
    """Tables written in the authors' layouts (``irpe.py``: bias (H', nb);
    contextual q / k (H', head_dim, nb), v (H', nb, head_dim); cross as
    rp_rows + rp_cols), converted, give the authors' attention."""
    torch.manual_seed(0)
    dims, heads, ratio, height, width = 16, 2, 1.9, 3, 4
    hd, h_tab = dims // heads, 1 if case['shared'] else heads
    method = conv.METHODS[case['method']]
    nb = conv.buckets_per_table(method, ratio)
    prefix = 'transformer.encoder.layers.0.self_attn.'
    authors = {
        prefix + 'in_proj_weight': torch.randn(3 * dims, dims) * 0.3,
        prefix + 'in_proj_bias': torch.randn(3 * dims) * 0.1,
        prefix + 'out_proj.weight': torch.randn(dims, dims) * 0.3,
        prefix + 'out_proj.bias': torch.randn(dims) * 0.1,
    }
    tables = {}
    for on in case['on']:
        if case['mode'] == 'bias':
            shape, name = (h_tab, nb), 'lookup_table_bias'
        elif on == 'v':
            shape, name = (h_tab, nb, hd), 'lookup_table_weight'
        else:
            shape, name = (h_tab, hd, nb), 'lookup_table_weight'
        axes = ['rp_rows.', 'rp_cols.'] if method == 'cross' else ['']
        tables[on] = [torch.randn(shape) for _ in axes]
        for axis, table in zip(axes, tables[on]):
            authors[f'{prefix}rpe_{on}.{axis}{name}'] = table
    setting = (f"rpe-{ratio}-{case['method']}-{case['mode']}-"
               f"{int(case['shared'])}-{case['on']}")
    converted = conv.convert(
        authors, enc_rpe2d=setting, nheads=heads, log=None)

    attn = PEMultiheadAttention(
        dims,
        heads,
        batch_first=True,
        rpe_cfg=dict(
            mode=conv.MODES[case['mode']],
            method=method,
            ratio=ratio,
            shared_head=case['shared']),
        rpe_on=case['on'])
    mine = 'encoder.layers.0.self_attn.'
    result = attn.load_state_dict(
        {k[len(mine):]: v
         for k, v in converted.items()}, strict=True)
    assert not result.missing_keys and not result.unexpected_keys

    x = torch.randn(2, height * width, dims)
    with torch.no_grad():
        out = attn(x, spatial_shape=(height, width)) - x  # no residual
    ref = _authors_attention(
        x.double(), *(authors[prefix + k].double()
                      for k in ('in_proj_weight', 'in_proj_bias',
                                'out_proj.weight', 'out_proj.bias')),
        {on: [t.double() for t in ts]
         for on, ts in tables.items()}, method, ratio, heads, height, width)
    torch.testing.assert_close(out.double(), ref, atol=REF_ATOL, rtol=0)
