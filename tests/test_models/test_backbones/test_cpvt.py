"""CPVT backbone: shapes, every position encoding, masks, freezing, errors,
and the timm DeiT weight mapping."""
import math
import os.path as osp
import subprocess
import sys

import pytest
import torch

from mmpe.models.backbones import CPVT
from mmpe.models.layers import resample_pos_embed
from mmpe.models.utils.timm_vit import timm_vit_to_cpvt

REPO = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))

POS_ENCODINGS = ['peg', 'none', 'learnable', 'sine', 'rope2d', 'irpe']
# tiny and fast: head dim 8 (a multiple of 4 for rope2d)
SMALL = dict(embed_dims=16, depth=3, num_heads=2, mlp_ratio=2.)
_F64_ATOL = 1e-9  # float64 through three blocks
_F32_ATOL = 2e-5  # float32, same ops in another order (timm vs CPVT)


def _cpvt(**kwargs):
    kwargs.setdefault('arch', SMALL)
    torch.manual_seed(0)
    return CPVT(**kwargs)


@pytest.mark.parametrize('size', [(32, 32), (50, 77), (17, 100), (100, 17),
                                  (16, 48), (1, 1)])
@pytest.mark.parametrize('use_cls_token', [False, True])
def test_cpvt_any_input_size(size, use_cls_token):
    model = _cpvt(use_cls_token=use_cls_token)
    x = torch.randn(2, 3, *size)
    (out, ) = model(x)
    assert out.shape == (2, 16, -(-size[0] // 16), -(-size[1] // 16))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize('pos_encoding', POS_ENCODINGS)
@pytest.mark.parametrize('use_cls_token', [False, True])
def test_cpvt_every_pos_encoding_forward_backward(pos_encoding,
                                                  use_cls_token):
    model = _cpvt(
        pos_encoding=pos_encoding,
        use_cls_token=use_cls_token,
        img_size=64,
        drop_path_rate=0.1,
        out_indices=(0, 2))
    model.train()
    x = torch.randn(2, 3, 40, 72, requires_grad=True)
    outs = model(x)
    assert [o.shape for o in outs] == [(2, 16, 3, 5)] * 2
    sum(o.square().mean() for o in outs).backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name


def test_cpvt_position_encoding_modules():
    assert len(_cpvt().pegs) == 1
    model = _cpvt(peg_positions=(0, 1, 2), peg_kernel_size=5)
    assert model.peg_positions == (0, 1, 2)
    assert model.pegs[0].kernel_size == 5
    assert _cpvt(pos_encoding='none').pegs.__len__() == 0
    learnable = _cpvt(pos_encoding='learnable', img_size=(64, 32),
                      use_cls_token=True)
    assert learnable.pos_embed.shape == (1, 1 + 4 * 2, 16)
    assert _cpvt(pos_encoding='peg').pos_embed is None


@pytest.mark.parametrize('pos_encoding', ['none', 'peg', 'sine', 'learnable'])
def test_cpvt_encodings_differ(pos_encoding):
    """Position encodings are in effect: shuffling patches changes output
    beyond the permutation, except without any encoding."""
    model = _cpvt(pos_encoding=pos_encoding, img_size=32).double().eval()
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    swapped = x.clone()  # swap the two top patches
    swapped[..., :16, :16], swapped[..., :16, 16:] = x[..., :16, 16:], \
        x[..., :16, :16]
    out = model(x)[0]
    out_sw = model(swapped)[0]
    same = torch.allclose(out[..., 0, 0], out_sw[..., 0, 1], atol=1e-9)
    assert same == (pos_encoding == 'none')


@pytest.mark.parametrize('out_indices,expected', [(-1, (2, )), (0, (0, )),
                                                  ((0, -1), (0, 2)),
                                                  ([2, 1, 2], (1, 2))])
def test_cpvt_out_indices(out_indices, expected):
    model = _cpvt(out_indices=out_indices)
    assert model.out_indices == expected
    outs = model(torch.randn(1, 3, 48, 32))
    assert len(outs) == len(expected)
    assert all(o.shape == (1, 16, 3, 2) for o in outs)


def test_cpvt_out_indices_equal_block_outputs():
    model = _cpvt(out_indices=(0, 1, 2)).eval()
    x = torch.randn(1, 3, 32, 48)
    outs = model(x)
    assert not torch.allclose(outs[0], outs[1])
    for i in range(3):
        single = _cpvt(out_indices=i).eval()
        single.load_state_dict(model.state_dict())
        torch.testing.assert_close(single(x)[0], outs[i], atol=0, rtol=0)


@pytest.mark.parametrize('frozen_stages', [0, 1, 3])
def test_cpvt_frozen_stages(frozen_stages):
    model = _cpvt(
        frozen_stages=frozen_stages,
        use_cls_token=True,
        pos_encoding='peg',
        peg_positions=(0, 2),
        drop_rate=0.1)
    model.train()
    assert not model.patch_embed.weight.requires_grad
    assert not model.cls_token.requires_grad
    for i, block in enumerate(model.blocks):
        frozen = i < frozen_stages
        assert all(p.requires_grad != frozen for p in block.parameters())
        assert block.training != frozen
    for pos, peg in zip(model.peg_positions, model.pegs):
        assert peg.proj.weight.requires_grad == (pos >= frozen_stages)
    assert model.norm.weight.requires_grad == (frozen_stages < 3)
    if frozen_stages < 3:  # frozen parts get no gradient; the rest does
        sum(o.sum() for o in model(torch.randn(1, 3, 32, 32))).backward()
        assert model.patch_embed.weight.grad is None
        assert model.blocks[-1].mlp.fc2.weight.grad is not None


@pytest.mark.parametrize('pos_encoding',
                         ['peg', 'none', 'sine', 'rope2d', 'irpe'])
@pytest.mark.parametrize('use_cls_token', [False, True])
def test_cpvt_padded_batch_equals_single_image(pos_encoding, use_cls_token):
    """With a padding mask every image gets its single-image features."""
    model = _cpvt(
        pos_encoding=pos_encoding,
        use_cls_token=use_cls_token,
        peg_positions=(0, 1),
        out_indices=(0, 2)).double().eval()
    sizes = [(40, 50), (64, 20)]
    images = [torch.randn(1, 3, *s, dtype=torch.float64) for s in sizes]
    batch = torch.randn(2, 3, 70, 60, dtype=torch.float64) * 5  # garbage
    mask = torch.ones(2, 70, 60, dtype=torch.bool)
    for i, (img, (h, w)) in enumerate(zip(images, sizes)):
        batch[i, :, :h, :w] = img[0]
        batch[i, :, h:, :] = 0  # mmdet pads with zeros; tokens that hold
        batch[i, :, :, w:] = 0  # real pixels then equal the single image's
        mask[i, :h, :w] = False
    outs = model(batch, padding_mask=mask)
    for i, (img, (h, w)) in enumerate(zip(images, sizes)):
        singles = model(img)
        ht, wt = -(-h // 16), -(-w // 16)
        for out, single in zip(outs, singles):
            torch.testing.assert_close(
                out[i:i + 1, :, :ht, :wt], single, atol=_F64_ATOL, rtol=0)
            assert (out[i, :, ht:] == 0).all()
            assert (out[i, :, :, wt:] == 0).all()
    # without padded pixels the mask changes nothing
    full = torch.zeros(2, 70, 60, dtype=torch.bool)
    torch.testing.assert_close(
        model(batch, padding_mask=full)[0], model(batch)[0], atol=0, rtol=0)


def test_cpvt_learnable_table_loads_from_other_grid():
    src = _cpvt(pos_encoding='learnable', img_size=64, use_cls_token=True)
    dst = _cpvt(pos_encoding='learnable', img_size=32, use_cls_token=True)
    dst.load_state_dict(src.state_dict())
    assert dst.pos_embed.shape == (1, 1 + 4, 16)
    torch.testing.assert_close(dst.pos_embed[:, :1], src.pos_embed[:, :1])


@pytest.mark.parametrize(
    'kwargs,match',
    [(dict(arch='huge'), 'arch'),
     (dict(arch=dict(embed_dims=16, depth=2, num_heads=2)), 'mlp_ratio'),
     (dict(arch=dict(SMALL, num_heads=3)), 'num_heads'),
     (dict(arch=dict(SMALL, depth=0)), 'depth'),
     (dict(pos_encoding='relative'), 'pos_encoding'),
     (dict(out_indices=3), 'out_indices'),
     (dict(out_indices=(0, -4)), 'out_indices'),
     (dict(out_indices=()), 'out_indices'),
     (dict(peg_kernel_size=4), 'kernel_size'),
     (dict(peg_positions=(3, )), 'peg_positions'),
     (dict(peg_positions=()), 'peg_positions'),
     (dict(frozen_stages=4), 'frozen_stages'),
     (dict(frozen_stages=-2), 'frozen_stages'),
     (dict(drop_path_rate=1.5), 'drop_path_rate'),
     (dict(img_size=0), 'img_size'),
     (dict(patch_size=0), 'patch_size'),
     (dict(arch=dict(SMALL, embed_dims=12, num_heads=2),
           pos_encoding='rope2d'), 'multiple of 4'),
     (dict(arch=dict(SMALL, embed_dims=18, num_heads=2),
           pos_encoding='sine'), 'multiple of 4'),
     (dict(rpe_cfg=dict(mode='bias')), 'rpe_cfg'),
     (dict(pos_encoding='irpe', rpe_cfg=dict(rpe_on='kk')), 'rpe_on'),
     (dict(pos_encoding='irpe', rpe_cfg=dict(skip=1)), 'skip')])
def test_cpvt_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _cpvt(**kwargs)


def test_cpvt_arch_aliases_and_registry():
    from mmdet.registry import MODELS
    for alias in ('t', 'tiny', 'deit-t', 'TINY'):
        assert CPVT.arch_zoo[alias.lower()]['embed_dims'] == 192
    model = MODELS.build(dict(type='CPVT', arch='tiny'))
    assert model.embed_dims == 192 and model.depth == 12
    assert model.num_heads == 3
    assert CPVT.arch_zoo['small']['num_heads'] == 6
    assert CPVT.arch_zoo['base']['embed_dims'] == 768


@pytest.mark.parametrize('rpe_on', ['k', 'qkv'])
def test_cpvt_irpe_modules(rpe_on):
    model = _cpvt(
        pos_encoding='irpe',
        use_cls_token=True,
        rpe_cfg=dict(mode='contextual', method='product', rpe_on=rpe_on))
    attn = model.blocks[0].attn
    present = [on for on in 'qkv' if getattr(attn, f'rpe_{on}') is not None]
    assert present == [on for on in 'qkv' if on in rpe_on]
    assert all(getattr(attn, f'rpe_{on}').skip == 1 for on in present)
    model(torch.randn(1, 3, 40, 30))[0].sum().backward()


# ------------------------------------------------------------------- timm
def _timm_layout_state_dict(depth, c, hidden, grid, prefix_rows=1):
    """Random weights with timm VisionTransformer's key names and shapes."""
    torch.manual_seed(0)
    sd = {
        'patch_embed.proj.weight': torch.randn(c, 3, 16, 16) * 0.05,
        'patch_embed.proj.bias': torch.randn(c) * 0.1,
        'cls_token': torch.randn(1, 1, c),
        'pos_embed': torch.randn(1, prefix_rows + grid * grid, c),
        'norm.weight': 1 + torch.randn(c) * 0.1,
        'norm.bias': torch.randn(c) * 0.1,
        'head.weight': torch.randn(10, c),
        'head.bias': torch.randn(10),
    }
    shapes = {
        'norm1': [(c, ), (c, )],
        'attn.qkv': [(3 * c, c), (3 * c, )],
        'attn.proj': [(c, c), (c, )],
        'norm2': [(c, ), (c, )],
        'mlp.fc1': [(hidden, c), (hidden, )],
        'mlp.fc2': [(c, hidden), (c, )],
    }
    for i in range(depth):
        for name, (w_shape, b_shape) in shapes.items():
            sd[f'blocks.{i}.{name}.weight'] = torch.randn(w_shape) * (
                0.1 if len(w_shape) == 2 else 1) + (len(w_shape) == 1)
            sd[f'blocks.{i}.{name}.bias'] = torch.randn(b_shape) * 0.1
    return {k: v.double() for k, v in sd.items()}


def deit_reference(sd, x, depth, num_heads, eps=1e-6):
    """DeiT forward written from the timm state dict, one head at a time.

    Returns the final-normed patch tokens after each block, (B, C, h, w).
    """
    import torch.nn.functional as F
    b = x.shape[0]
    c = sd['cls_token'].shape[-1]
    d = c // num_heads
    t = F.conv2d(x, sd['patch_embed.proj.weight'],
                 sd['patch_embed.proj.bias'], stride=16)
    h, w = t.shape[-2:]
    t = t.flatten(2).transpose(1, 2)  # (B, h*w, C)
    t = torch.cat([sd['cls_token'].expand(b, -1, -1), t], 1) + sd['pos_embed']
    outs = []
    for i in range(depth):
        p = f'blocks.{i}.'

        def lin(z, name):
            return z @ sd[p + name + '.weight'].T + sd[p + name + '.bias']

        y = F.layer_norm(t, (c, ), sd[p + 'norm1.weight'],
                         sd[p + 'norm1.bias'], eps)
        q, k, v = lin(y, 'attn.qkv').chunk(3, dim=-1)
        heads = []
        for head in range(num_heads):
            sl = slice(head * d, (head + 1) * d)
            logits = q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(d)
            heads.append(logits.softmax(-1) @ v[..., sl])
        t = t + lin(torch.cat(heads, -1), 'attn.proj')
        y = F.layer_norm(t, (c, ), sd[p + 'norm2.weight'],
                         sd[p + 'norm2.bias'], eps)
        t = t + lin(F.gelu(lin(y, 'mlp.fc1')), 'mlp.fc2')
        out = F.layer_norm(t, (c, ), sd['norm.weight'], sd['norm.bias'], eps)
        outs.append(out[:, 1:].transpose(1, 2).reshape(b, c, h, w))
    return outs


@pytest.mark.parametrize('size', [(64, 64), (48, 80)])
def test_timm_layout_mapping_matches_reference_deit(size):
    """Without timm: a timm-layout state dict, mapped, gives the DeiT
    forward written out in the test (table resampled at other sizes)."""
    depth, c, heads = 2, 16, 2
    sd = _timm_layout_state_dict(depth, c, 32, grid=4)
    model = CPVT(
        arch=dict(embed_dims=c, depth=depth, num_heads=heads, mlp_ratio=2.),
        img_size=64,
        pos_encoding='learnable',
        use_cls_token=True,
        out_indices=(0, 1)).double().eval()
    model.load_state_dict(timm_vit_to_cpvt(sd, 'learnable', True),
                          strict=True)
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    ref_sd = dict(sd)
    ref_sd['pos_embed'] = resample_pos_embed(
        sd['pos_embed'], (4, 4), (size[0] // 16, size[1] // 16), 1)
    with torch.no_grad():
        for out, ref in zip(model(x), deit_reference(ref_sd, x, depth,
                                                     heads)):
            torch.testing.assert_close(out, ref, atol=_F64_ATOL, rtol=0)


def _timm_deit(timm, name='deit_tiny_patch16_224'):
    """A real timm DeiT-Tiny with random weights (no download). ``timm`` is
    the conftest fixture: the real package, imported beside a torchvision
    stand-in because torchvision's compiled ops do not load beside this CPU
    torch, and timm uses torchvision only for data transforms (see
    tests/timm_stub.py)."""
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False)
    with torch.no_grad():  # timm zero-inits some tables; make all random
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    return model.eval()


@pytest.mark.parametrize('name',
                         ['deit_tiny_patch16_224', 'vit_tiny_patch16_224'])
def test_timm_mapping_identical_outputs_learnable(timm, name):
    """timm DeiT-Tiny / ViT-Tiny == CPVT('tiny', learnable, class token)
    per block."""
    deit = _timm_deit(timm, name)
    state = timm_vit_to_cpvt(deit.state_dict(), 'learnable', True)
    model = CPVT(
        arch='tiny',
        pos_encoding='learnable',
        use_cls_token=True,
        out_indices=tuple(range(12))).eval()
    model.load_state_dict(state, strict=True)

    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        outs = model(x)
        tokens = deit.patch_embed(x)
        tokens = deit._pos_embed(tokens)
        for i, block in enumerate(deit.blocks):
            tokens = block(tokens)
            ref = deit.norm(tokens)[:, 1:]  # (B, 196, C)
            # (B, 196, C) -> (B, C, 14, 14)
            ref = ref.transpose(1, 2).reshape(2, 192, 14, 14)
            torch.testing.assert_close(
                outs[i], ref, atol=_F32_ATOL, rtol=_F32_ATOL)
        final = deit.forward_features(x)[:, 1:]
    torch.testing.assert_close(
        outs[-1].flatten(2).transpose(1, 2), final, atol=_F32_ATOL,
        rtol=_F32_ATOL)


def test_timm_mapping_peg_drops_table_and_blocks_match(timm):
    deit = _timm_deit(timm)
    state = timm_vit_to_cpvt(deit.state_dict())  # 'peg', no class token
    assert 'pos_embed' not in state and 'cls_token' not in state
    assert not any(k.startswith('head') for k in state)
    model = CPVT(arch='tiny').eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert sorted(missing) == ['pegs.0.proj.bias', 'pegs.0.proj.weight']
    assert not unexpected
    tokens = torch.randn(2, 7 * 5, 192)
    with torch.no_grad():
        for ours, theirs in zip(model.blocks, deit.blocks):
            torch.testing.assert_close(
                ours(tokens, (7, 5)), theirs(tokens), atol=_F32_ATOL,
                rtol=_F32_ATOL)
        torch.testing.assert_close(model.patch_embed(torch.ones(1, 3, 16,
                                                                16)),
                                   deit.patch_embed.proj(torch.ones(
                                       1, 3, 16, 16)))


def test_timm_mapping_variants_and_errors():
    c = 8
    base = {
        'patch_embed.proj.weight': torch.randn(c, 3, 16, 16),
        'patch_embed.proj.bias': torch.randn(c),
        'cls_token': torch.randn(1, 1, c),
        'dist_token': torch.randn(1, 1, c),
        'pos_embed': torch.randn(1, 2 + 9, c),  # distilled DeiT
        'blocks.0.attn.qkv.weight': torch.randn(3 * c, c),
        'norm.weight': torch.randn(c),
        'head.weight': torch.randn(10, c),
        'head_dist.weight': torch.randn(10, c),
    }
    out = timm_vit_to_cpvt(
        {'module.' + k: v for k, v in base.items()}, 'learnable', True)
    torch.testing.assert_close(
        out['pos_embed'],
        torch.cat([base['pos_embed'][:, :1], base['pos_embed'][:, 2:]], 1))
    out = timm_vit_to_cpvt(base, 'learnable', False)
    torch.testing.assert_close(out['pos_embed'], base['pos_embed'][:, 2:])
    assert 'patch_embed.weight' in out and 'dist_token' not in out
    with pytest.raises(ValueError, match='no CPVT counterpart'):
        timm_vit_to_cpvt(dict(base, **{'blocks.0.ls1.gamma': torch.ones(c)}))
    with pytest.raises(ValueError, match='pos_encoding'):
        timm_vit_to_cpvt(base, 'abs')


def test_timm_converter_cli(tmp_path, timm):
    deit = _timm_deit(timm)
    src = tmp_path / 'deit.pth'
    dst = tmp_path / 'out' / 'cpvt.pth'
    torch.save({'model': deit.state_dict()}, src)
    subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools/model_converters/timm_vit_to_cpvt.py'),
        str(src),
        str(dst)
    ],
                   check=True,
                   cwd=REPO)
    ckpt = torch.load(dst, weights_only=True)
    assert ckpt['meta']['pos_encoding'] == 'peg'
    model = CPVT(
        arch='tiny',
        init_cfg=dict(type='Pretrained', checkpoint=str(dst)))
    model.init_weights()
    torch.testing.assert_close(model.blocks[3].attn.qkv.weight,
                               deit.blocks[3].attn.qkv.weight)
