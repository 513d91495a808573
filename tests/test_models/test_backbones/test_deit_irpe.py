"""CPVT as the iRPE authors' DeiT-with-iRPE: their recorded tokens.

Expected values come from outside mmpe: tokens recorded by running the
authors' DeiT-with-iRPE code (class token, learnable absolute table and
contextual product iRPE with skip 1 in every block) on a tiny model, in
``tests/data/irpe_authors/`` (its README describes every
array). Their weights go through tools/model_converters/deit_irpe_to_mmpe.py
into a CPVT built from the fixture's ``arch`` / ``setting`` strings.
"""
import importlib.util
import os.path as osp

import numpy as np
import pytest
import torch

from mmpe.models.backbones import CPVT

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..', '..'))
FIXTURES = osp.join(ROOT, 'tests', 'data', 'irpe_authors')
SETTINGS = ('k', 'qkv')
# float32 through 2 blocks; the authors index a (L, L) bucket map where
# mmpe factorises the product method, so sums run in another order
ATOL = 1e-4

spec = importlib.util.spec_from_file_location(
    'deit_irpe_to_mmpe',
    osp.join(ROOT, 'tools', 'model_converters', 'deit_irpe_to_mmpe.py'))
conv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(conv)

def _fixture(rpe_on):
    path = osp.join(FIXTURES, f'deit_irpe_ctx_product_{rpe_on}.npz')
    data = np.load(path)
    print(path, data.files)
    # 'img_size=224 patch_size=16 embed_dim=64 depth=2 num_heads=4 ...'
    arch = dict(item.split('=', 1) for item in str(data['arch']).split())
    authors = {
        k[len('model/'):]: torch.from_numpy(data[k])
        for k in data.files if k.startswith('model/')
    }
    return data, arch, authors


def _cpvt(data, arch, **kwargs):
    """The CPVT of the fixture, from its own description (not the
    converter's)."""
    ratio, method, mode, shared, skip, rpe_on = str(
        data['setting']).split(',')
    assert (mode, skip, arch['qkv_bias']) == ('ctx', '1', 'True')
    dims = int(arch['embed_dim'])
    kwargs.setdefault('img_size', int(arch['img_size']))
    torch.manual_seed(0)
    model = CPVT(
        arch=dict(
            embed_dims=dims,
            depth=int(arch['depth']),
            num_heads=int(arch['num_heads']),
            mlp_ratio=float(arch['mlp_ratio'])),
        patch_size=int(arch['patch_size']),
        pos_encoding=('learnable', 'irpe'),
        use_cls_token=True,  # skip = 1
        rpe_cfg=dict(
            mode='contextual',
            method=method,
            ratio=float(ratio),
            shared_head=shared == '1',
            rpe_on=rpe_on),
        qkv_bias=True,
        norm_cfg=dict(type='LN', eps=float(arch['layernorm_eps'])),
        final_norm=True,
        **kwargs)
    return model


@pytest.mark.parametrize('rpe_on', SETTINGS)
def test_tokens_match_the_authors(rpe_on):
    data, arch, authors = _fixture(rpe_on)
    model = _cpvt(data, arch)
    model.load_state_dict(conv.convert(authors, log=None), strict=True)
    model.eval()
    with torch.no_grad():
        tokens, hw = model.forward_tokens(torch.from_numpy(data['input']))
        final = model.norm(tokens[-1])
    side = int(arch['img_size']) // int(arch['patch_size'])
    assert tuple(hw) == (side, side)
    assert len(tokens) == int(arch['depth'])
    for i, out in enumerate(tokens):
        # (B, 1 + 14 * 14, C), class token first
        torch.testing.assert_close(
            out, torch.from_numpy(data[f'block{i}']), atol=ATOL, rtol=0)
    torch.testing.assert_close(
        final, torch.from_numpy(data['final_norm']), atol=ATOL, rtol=0)


@pytest.mark.parametrize('rpe_on', SETTINGS)
def test_converted_backbone_runs_at_other_sizes(rpe_on):
    data, arch, authors = _fixture(rpe_on)
    state = conv.convert(authors, log=None)
    depth, dims = int(arch['depth']), int(arch['embed_dim'])
    model = _cpvt(data, arch, out_indices=tuple(range(depth)))
    model.load_state_dict(state, strict=True)
    x = torch.randn(2, 3, 320, 480)
    outs = model(x)
    assert len(outs) == depth
    for out in outs:
        assert out.shape == (2, dims, 20, 30)
        assert torch.isfinite(out).all()
    sum(o.square().mean() for o in outs).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), \
            name
    # the 14 x 14 table resampled (class row kept) on run at 20 x 30, and
    # on load into a model pre-trained at 320 x 480
    tokens, hw = model.forward_tokens(x)
    assert tuple(hw) == (20, 30)
    assert tokens[-1].shape == (2, 1 + 20 * 30, dims)
    model = _cpvt(data, arch, img_size=(320, 480))
    model.load_state_dict(state, strict=True)
    assert model.pos_embed.shape == (1, 1 + 20 * 30, dims)
    torch.testing.assert_close(model.pos_embed[:, :1],
                               state['pos_embed'][:, :1])
