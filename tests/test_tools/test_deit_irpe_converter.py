"""tools/model_converters/deit_irpe_to_mmpe.py: names, settings, errors, CLI.

Expected settings and shapes are written from the authors' code
(microsoft/Cream ``iRPE/DeiT-with-iRPE``: ``rpe_models.py``'s
``get_rpe_config`` calls, ``models.py``'s DeiT sizes, ``irpe.py``'s table
layouts and ``get_num_buckets``); that the converted weights compute what
the authors' model computes is proven on their recorded outputs in
tests/test_models/test_backbones/test_deit_irpe.py.
"""
import argparse
import importlib.util
import os.path as osp

import numpy as np
import pytest
import torch

from mmpe.models.backbones import CPVT

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
FIXTURES = osp.join(ROOT, 'tests', 'data', 'irpe_authors')

spec = importlib.util.spec_from_file_location(
    'deit_irpe_to_mmpe',
    osp.join(ROOT, 'tools', 'model_converters', 'deit_irpe_to_mmpe.py'))
conv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(conv)

# the authors' model list (rpe_models.py): name -> (method, ratio, rpe_on)
# as passed to their get_rpe_config (all mode='ctx', shared_head=True,
# skip=1), and the heads of their DeiT size (models.py)
AUTHORS_MODELS = {
    'deit_tiny_patch16_224_ctx_product_50_shared_k': ('product', 1.9, 'k', 3),
    'deit_small_patch16_224_ctx_euc_20_shared_k': ('euclidean', 20, 'k', 6),
    'deit_small_patch16_224_ctx_quant_51_shared_k': ('quant', 33, 'k', 6),
    'deit_small_patch16_224_ctx_cross_56_shared_k': ('cross', 20, 'k', 6),
    'deit_small_patch16_224_ctx_product_50_shared_k': ('product', 1.9, 'k',
                                                       6),
    'deit_small_patch16_224_ctx_product_50_shared_qk': ('product', 1.9, 'qk',
                                                        6),
    'deit_small_patch16_224_ctx_product_50_shared_qkv': ('product', 1.9,
                                                         'qkv', 6),
    'deit_base_patch16_224_ctx_product_50_shared_k': ('product', 1.9, 'k',
                                                      12),
    'deit_base_patch16_224_ctx_product_50_shared_qkv': ('product', 1.9,
                                                        'qkv', 12),
}
HEAD_DIM = 8  # small stand-ins for the real sizes (64 per head)


def _authors_buckets(method, ratio):
    """Their get_num_buckets (beta = 2 * ratio) + 1 skip bucket, per table
    (cross: per axis)."""
    beta = int(2 * ratio)
    return ((2 * beta + 1)**2 if method == 'product' else 2 * beta + 1) + 1


def _authors_state_dict(method, ratio, rpe_on, heads, depth=2):
    """A state dict in the authors' names and shapes (their
    rpe_vision_transformer.py / irpe.py), random values."""
    dims, nb = heads * HEAD_DIM, _authors_buckets(method, ratio)
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    sd = {
        'cls_token': r(1, 1, dims),
        'pos_embed': r(1, 1 + 14 * 14, dims),
        'patch_embed.proj.weight': r(dims, 3, 16, 16),
        'patch_embed.proj.bias': r(dims),
    }
    for i in range(depth):
        p = f'blocks.{i}.'
        for name, shape in (('norm1', (dims, )), ('norm2', (dims, )),
                            ('attn.qkv', (3 * dims, dims)),
                            ('attn.proj', (dims, dims)),
                            ('mlp.fc1', (4 * dims, dims)),
                            ('mlp.fc2', (dims, 4 * dims))):
            sd[p + name + '.weight'] = r(*shape)
            sd[p + name + '.bias'] = r(shape[0])
        for on in rpe_on:
            # q / k (1, head_dim, nb), v (1, nb, head_dim)
            shape = (1, HEAD_DIM, nb) if on in 'qk' else (1, nb, HEAD_DIM)
            axes = ('rp_rows.', 'rp_cols.') if method == 'cross' else ('', )
            for axis in axes:
                sd[f'{p}attn.rpe_{on}.{axis}lookup_table_weight'] = r(*shape)
    sd['norm.weight'], sd['norm.bias'] = r(dims), r(dims)
    sd['head.weight'], sd['head.bias'] = r(1000, dims), r(1000)
    return sd


@pytest.mark.parametrize('name', sorted(AUTHORS_MODELS))
def test_model_names_give_the_authors_settings(name):
    method, ratio, rpe_on, heads = AUTHORS_MODELS[name]
    setting = conv.parse_model_name(name + '.pth')
    assert setting == dict(
        num_heads=heads,
        patch_size=16,
        img_size=224,
        mode='contextual',
        method=method,
        ratio=ratio,
        shared_head=True,
        rpe_on=rpe_on)


@pytest.mark.parametrize('name', sorted(AUTHORS_MODELS))
def test_every_model_of_the_list_loads_strictly(name):
    """Shapes of every method (product, euclidean, quant, cross with
    rp_rows + rp_cols) fit the CPVT the converter prints."""
    method, ratio, rpe_on, heads = AUTHORS_MODELS[name]
    sd = _authors_state_dict(method, ratio, rpe_on, heads)
    out = conv.convert(sd, log=None)
    assert not any(k.startswith('head') for k in out)
    cfg = conv.cpvt_config(out, conv.parse_model_name(name))
    assert cfg.pop('type') == 'CPVT'
    assert cfg['arch'] == dict(
        embed_dims=heads * HEAD_DIM, depth=2, num_heads=heads, mlp_ratio=4.)
    assert cfg['pos_encoding'] == ('learnable', 'irpe')
    assert cfg['use_cls_token'] and cfg['img_size'] == 224
    assert cfg['rpe_cfg'] == dict(
        mode='contextual',
        method=method,
        ratio=ratio,
        shared_head=True,
        rpe_on=rpe_on)
    model = CPVT(**cfg)
    model.load_state_dict(out, strict=True)
    nb = _authors_buckets(method, ratio) * (2 if method == 'cross' else 1)
    for on in rpe_on:
        table = getattr(model.blocks[1].attn, f'rpe_{on}').table
        assert table.shape == (1, nb, HEAD_DIM)


def test_module_prefix_and_classifier():
    sd = _authors_state_dict('product', 1.9, 'k', 2, depth=1)
    wrapped = {'module.' + k: v for k, v in sd.items()}
    lines = []
    out = conv.convert(wrapped, log=lines.append)
    # the CPVT names of the contract, head dropped
    assert sorted(out) == sorted([
        'cls_token', 'pos_embed', 'patch_embed.weight', 'patch_embed.bias',
        'norm.weight', 'norm.bias', 'blocks.0.attn.rpe_k.table'
    ] + [
        f'blocks.0.{n}.{p}' for n in ('norm1', 'norm2', 'attn.qkv',
                                      'attn.proj', 'mlp.fc1', 'mlp.fc2')
        for p in ('weight', 'bias')
    ])
    assert torch.equal(out['patch_embed.weight'],
                       sd['patch_embed.proj.weight'])
    # q / k tables (1, head_dim, nb) -> (1, nb, head_dim)
    assert torch.equal(out['blocks.0.attn.rpe_k.table'],
                       sd['blocks.0.attn.rpe_k.lookup_table_weight'][0].t()
                       [None])
    assert any('head.weight' in line for line in lines)


@pytest.mark.parametrize(
    'key,shape',
    [
        ('blocks.0.attn.rpe_k.lookup_table_wieght', (1, 8, 50)),  # typo
        ('blocks.0.attn.rpe_v.lookup_table_bias', (1, 50)),  # no v bias
        ('blocks.0.attn.rpe_k.lookup_table_weight', (8, 50)),  # not 3-D
        ('dist_token', (1, 1, 16)),  # distilled DeiT
        ('blocks.0.ls1.gamma', (16, )),  # LayerScale: not DeiT-with-iRPE
        ('pre_logits.fc.weight', (16, 16)),
        ('blocks.0.attn.rpe_q.rp_rows.lookup_table_weight',
         (1, 8, 82)),  # cross without rp_cols
    ])
def test_unplaceable_key_is_an_error(key, shape):
    with pytest.raises(ValueError, match=key.replace('.', r'\.')):
        conv.convert({key: torch.zeros(shape)}, log=None)


def test_blocks_with_different_tables_are_an_error():
    sd = _authors_state_dict('product', 1.9, 'k', 2)
    del sd['blocks.1.attn.rpe_k.lookup_table_weight']
    with pytest.raises(ValueError, match='different iRPE tables'):
        conv.convert(sd, log=None)


def test_setting_contradictions_are_errors():
    out = conv.convert(
        _authors_state_dict('product', 1.9, 'k', 2), log=None)
    # 50 buckets are ratio 1.9 (or 1.5-1.99); ratio 2.0 gives 82
    with pytest.raises(ValueError, match='50 buckets.*gives 82'):
        conv.cpvt_config(out, dict(method='product', ratio=2.0))
    with pytest.raises(ValueError, match='rpe_on'):
        conv.cpvt_config(out, dict(method='product', ratio=1.9, rpe_on='qkv'))
    with pytest.raises(ValueError, match='num_heads'):
        conv.cpvt_config(out, dict(method='product', ratio=1.9), num_heads=4)
    with pytest.raises(ValueError, match='--method and --ratio'):
        conv.cpvt_config(out, None)


def test_cli_on_the_authors_fixture(tmp_path, capsys):
    data = np.load(osp.join(FIXTURES, 'deit_irpe_ctx_product_qkv.npz'))
    authors = {
        k[len('model/'):]: torch.from_numpy(data[k])
        for k in data.files if k.startswith('model/')
    }
    # setting: 'ratio,method,mode,shared_head,skip,rpe_on' (README)
    ratio, method, mode, shared, skip, rpe_on = str(data['setting']).split(',')
    src, dst = str(tmp_path / 'checkpoint.pth'), str(tmp_path / 'out.pth')
    # as the authors' main.py saves it; args.model is not one of their
    # names (a 64-dim model), so the setting comes from the flags
    torch.save(
        dict(model=authors, args=argparse.Namespace(model='tiny_test')),
        src)
    conv.main([src, dst, '--method', method, '--ratio', ratio])
    printed = capsys.readouterr().out
    assert "'rpe_on': 'qkv'" in printed and 'dropped' in printed
    ckpt = torch.load(dst, map_location='cpu', weights_only=True)
    cfg = ckpt['meta']['cpvt']
    assert cfg['rpe_cfg'] == dict(
        mode='contextual' if mode == 'ctx' else mode,
        method=method,
        ratio=float(ratio),
        shared_head=shared == '1',
        rpe_on=rpe_on)
    assert cfg['use_cls_token'] == (skip == '1')
    assert set(ckpt['state_dict']) == {
        k for k in authors if not k.startswith('head.')
    } - {k for k in authors if 'rpe_' in k or 'patch_embed' in k} | {
        f'blocks.{i}.attn.rpe_{on}.table'
        for i in range(2) for on in 'qkv'
    } | {'patch_embed.weight', 'patch_embed.bias'}

    # the model name in the file disagrees with the tables' head dim
    torch.save(authors,
               str(tmp_path / 'deit_tiny_patch16_224_ctx_product_50_shared_'
                   'qkv.pth'))
    with pytest.raises(ValueError, match='num_heads'):
        conv.main([
            str(tmp_path / 'deit_tiny_patch16_224_ctx_product_50_shared_'
                'qkv.pth'), dst
        ])
