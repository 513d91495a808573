"""CPVT with pos_encoding='rope-mixed': timm's RoPE-Mixed ViT weights give
timm's block outputs, composition, gradients, freezing, errors."""
import pytest
import torch

from mmpe.models.backbones import CPVT
from mmpe.models.utils.timm_vit import timm_vit_to_cpvt

# head dim 16 (4 frequency pairs per quarter), 4 heads, 2 blocks
ARCH = dict(embed_dims=64, depth=2, num_heads=4, mlp_ratio=4.)
# float32, same products summed in another order (q . k over permuted
# channels, LayerScale folded into the linear); observed ~3e-7
_F32_ATOL = 2e-5


def _timm_rope_mixed(timm, **kwargs):
    """A small timm RoPE-Mixed ViT (Eva blocks, LayerScale, class token)
    with non-trivial LayerScale and frequencies."""
    torch.manual_seed(0)
    model = timm.create_model(
        'vit_small_patch16_rope_mixed_224', pretrained=False, img_size=64,
        depth=ARCH['depth'], embed_dim=ARCH['embed_dims'],
        num_heads=ARCH['num_heads'], **kwargs).eval()
    with torch.no_grad():
        for block in model.blocks:
            # 1e-5 (timm's init) would hide the attention branch
            block.gamma_1.uniform_(0.5, 1.5)
            block.gamma_2.uniform_(0.5, 1.5)
            # peaked attention: with timm's small init the logits are ~0 and
            # attention nearly uniform, whatever the rotation
            block.attn.qkv.weight.mul_(10.)
        for p in model.parameters():  # avoid zero biases: test them too
            if p.dim() == 1 and torch.all(p == 0):
                p.normal_(0, 0.02)
    return model


def _cpvt(**kwargs):
    torch.manual_seed(1)
    kwargs.setdefault('arch', ARCH)
    return CPVT(pos_encoding='rope-mixed', **kwargs)


def _timm_tokens(model, x):
    """Tokens after every timm block (class token first)."""
    tokens = model.patch_embed(x)
    tokens, rot = model._pos_embed(tokens)
    tokens = model.norm_pre(tokens)
    outs = []
    for i, block in enumerate(model.blocks):
        tokens = block(tokens, rope=rot[i])
        outs.append(tokens)
    return outs


@pytest.mark.parametrize('size', [(64, 64), (48, 80), (80, 32)])
def test_timm_rope_mixed_vit_equals_cpvt_per_block(timm, size):
    model = _timm_rope_mixed(timm, dynamic_img_size=True)
    assert model.rope_mixed and model.rope.grid_indexing == 'xy'
    state = timm_vit_to_cpvt(model.state_dict(), 'rope-mixed', True)
    assert sorted(k for k in state if 'ropes' in k) == [
        'ropes.0.freqs', 'ropes.1.freqs'
    ]
    ours = _cpvt(img_size=64, use_cls_token=True, out_indices=(0, 1)).eval()
    ours.load_state_dict(state, strict=True)
    torch.manual_seed(2)
    x = torch.randn(2, 3, *size)
    h, w = size[0] // 16, size[1] // 16
    with torch.no_grad():
        refs = _timm_tokens(model, x)
        tokens, hw_shape = ours.forward_tokens(x)
        outs = ours(x)
        final = model.forward_features(x)
    assert hw_shape == (h, w)
    for mine, ref in zip(tokens, refs):
        torch.testing.assert_close(mine, ref, atol=_F32_ATOL, rtol=_F32_ATOL)
    # final norm, class token dropped, NCHW
    ref_map = final[:, 1:].transpose(1, 2).reshape(2, -1, h, w)
    torch.testing.assert_close(outs[-1], ref_map, atol=_F32_ATOL,
                               rtol=_F32_ATOL)


def test_timm_rope_mixed_fixed_size_model(timm):
    """The released models' setting (no dynamic size, rope grid cached)."""
    model = _timm_rope_mixed(timm)
    ours = _cpvt(img_size=64, use_cls_token=True, out_indices=(0, 1)).eval()
    ours.load_state_dict(
        timm_vit_to_cpvt(model.state_dict(), 'rope-mixed', True))
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(
            ours.forward_tokens(x)[0][-1], _timm_tokens(model, x)[-1],
            atol=_F32_ATOL, rtol=_F32_ATOL)


def test_timm_rope_mixed_ape_equals_learnable_plus_rope_mixed(timm):
    """``vit_*_rope_mixed_ape_*``: a grid-only absolute table (no class
    row) beside RoPE-Mixed == CPVT ('learnable', 'rope-mixed')."""
    torch.manual_seed(0)
    model = timm.create_model(
        'vit_small_patch16_rope_mixed_ape_224', pretrained=False,
        img_size=64, depth=ARCH['depth'], embed_dim=ARCH['embed_dims'],
        num_heads=ARCH['num_heads']).eval()
    with torch.no_grad():
        model.pos_embed.normal_()
        for block in model.blocks:
            block.gamma_1.fill_(1.)
            block.attn.qkv.weight.mul_(10.)
    encodings = ('learnable', 'rope-mixed')
    ours = CPVT(arch=ARCH, img_size=64, pos_encoding=encodings,
                use_cls_token=True).eval()
    ours.load_state_dict(
        timm_vit_to_cpvt(model.state_dict(), encodings, True), strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        for mine, ref in zip(ours.forward_tokens(x)[0],
                             _timm_tokens(model, x)):
            torch.testing.assert_close(mine, ref, atol=_F32_ATOL,
                                       rtol=_F32_ATOL)


def test_timm_rope_mixed_without_rope_target_drops_freqs(timm):
    model = _timm_rope_mixed(timm)
    state = timm_vit_to_cpvt(model.state_dict(), 'peg', False)
    assert not any('rope' in k or 'gamma' in k for k in state)
    # no permutation without the rotation: qkv as in timm
    torch.testing.assert_close(state['blocks.0.attn.qkv.weight'],
                               model.blocks[0].attn.qkv.weight)


def test_checkpoint_of_other_heads_is_value_error(timm):
    model = _timm_rope_mixed(timm)
    state = timm_vit_to_cpvt(model.state_dict(), 'rope-mixed', True)
    other = _cpvt(
        arch=dict(ARCH, num_heads=2), img_size=64, use_cls_token=True)
    with pytest.raises(ValueError, match='num_heads=2'):
        other.load_state_dict(state)


def test_per_block_frequencies_learn_and_compose():
    torch.manual_seed(1)
    model = CPVT(arch=ARCH, pos_encoding=('sine', 'peg', 'rope-mixed'),
                 use_cls_token=True)
    assert len(model.ropes) == ARCH['depth']
    assert model.ropes[0].freqs.shape == (2, 4, 8)
    assert not torch.equal(model.ropes[0].freqs, model.ropes[1].freqs)
    for size in ((40, 72), (96, 33)):  # any grid, no resampling
        (out, ) = model(torch.randn(2, 3, *size))
        assert out.shape == (2, 64, -(-size[0] // 16), -(-size[1] // 16))
        out.square().mean().backward()
    for rope in model.ropes:
        assert rope.freqs.grad is not None and rope.freqs.grad.abs().sum() > 0


def test_padding_mask_with_rope_mixed_gives_single_image_features():
    model = _cpvt(use_cls_token=False).eval()
    small = torch.randn(1, 3, 40, 56)
    big = torch.zeros(1, 3, 64, 80)
    big[..., :40, :56] = small
    mask = torch.ones(1, 64, 80, dtype=torch.bool)
    mask[:, :40, :56] = False
    with torch.no_grad():
        (alone, ) = model(small)
        (padded, ) = model(big, padding_mask=mask)
    torch.testing.assert_close(padded[..., :3, :4], alone, atol=_F32_ATOL,
                               rtol=_F32_ATOL)


def test_frozen_stages_freeze_block_frequencies():
    model = _cpvt(frozen_stages=1)
    assert not model.ropes[0].freqs.requires_grad
    assert model.ropes[1].freqs.requires_grad


def test_bad_configs():
    with pytest.raises(ValueError, match='rope2d'):
        CPVT(arch=ARCH, pos_encoding=('rope2d', 'rope-mixed'))
    with pytest.raises(ValueError, match='6'):  # 24 / 4 heads
        CPVT(arch=dict(ARCH, embed_dims=24), pos_encoding='rope-mixed')
    with pytest.raises(ValueError, match='theta'):
        CPVT(arch=ARCH, pos_encoding='rope-mixed', rope_theta=0.)
