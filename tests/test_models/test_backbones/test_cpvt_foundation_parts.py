"""The plain ViT's parts for the foundation models (DINOv2, DINOv3,
EVA-02): register tokens, LayerScale, the SwiGLU feed-forward with EVA-02's
sub-LN, ``block_cfg``; what the authors' models compute with them is
tested by the converters' tests (tests/test_tools/test_dinov{2,3}_
converter.py)."""
import pytest
import torch
import torch.nn.functional as F

from mmpe.models.backbones import CPVT
from mmpe.models.layers.blocks.vit_block import SwiGLU, ViTBlock

SMALL = dict(embed_dims=16, depth=2, num_heads=2, mlp_ratio=2.)
_F32_ATOL = 1e-6  # float32, one layer written out


def _cpvt(**kwargs):
    torch.manual_seed(0)
    return CPVT(arch=SMALL, **kwargs)


def test_registers_follow_the_class_token_without_a_table_row():
    """[class, registers, patches]; the table holds the class token and the
    grid only; the registers enter without a position (DINOv2)."""
    model = _cpvt(pos_encoding='learnable', use_cls_token=True,
                  num_register_tokens=3, img_size=32,
                  block_cfg=dict(layer_scale_init=0.)).eval()
    assert model.num_skip == 4
    assert model.pos_embed.shape == (1, 1 + 4, 16)
    with torch.no_grad():
        model.register_tokens.normal_()
        model.pos_embed.normal_()
        # LayerScale 0: every block is the identity, so the tokens are the
        # input stage's
        tokens, _ = model.forward_tokens(torch.randn(1, 3, 32, 32))
    x = tokens[-1][0]
    torch.testing.assert_close(x[0], model.cls_token[0, 0] +
                               model.pos_embed[0, 0])
    torch.testing.assert_close(x[1:4], model.register_tokens[0])


def test_registers_are_stage_zero_and_frozen_with_it():
    model = _cpvt(use_cls_token=True, num_register_tokens=2,
                  frozen_stages=0)
    assert model.param_layer_id('register_tokens') == 0
    assert not model.register_tokens.requires_grad


@pytest.mark.parametrize('kwargs, message', [
    (dict(num_register_tokens=2, window_size=4),
     r'`num_register_tokens=2` with `window_size=4`'),
    (dict(num_register_tokens=-1), 'num_register_tokens'),
    (dict(block_cfg=dict(layer_scale=1.)), r"`block_cfg` keys \['layer_scale"),
    (dict(block_cfg=dict(mlp_type='geglu')), r"mlp_type.*'swiglu-subln'"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _cpvt(**kwargs)


def test_swiglu_with_sub_ln_is_eva02s_feed_forward():
    """``fc2(LN(SiLU(fc1_g x) * fc1_x x))`` (EVA-02's SwiGLU, sub-LN on)."""
    torch.manual_seed(1)
    mlp = SwiGLU(8, 12, sub_norm_cfg=dict(type='LN', eps=1e-6))
    with torch.no_grad():
        mlp.norm.weight.normal_()
        x = torch.randn(2, 5, 8)
        hidden = F.silu(x @ mlp.fc1_g.weight.T + mlp.fc1_g.bias) * (
            x @ mlp.fc1_x.weight.T + mlp.fc1_x.bias)
        hidden = F.layer_norm(hidden, (12, ), mlp.norm.weight,
                              mlp.norm.bias, 1e-6)
        want = hidden @ mlp.fc2.weight.T + mlp.fc2.bias
        torch.testing.assert_close(mlp(x), want, atol=_F32_ATOL, rtol=0)
    plain = ViTBlock(8, 2, mlp_ratio=1.5, mlp_type='swiglu')
    assert isinstance(plain.mlp.norm, torch.nn.Identity)


def test_layer_scale_scales_each_branch():
    """``x + g1 * attn(norm1 x)``, then ``+ g2 * mlp(norm2 .)``: with g2 = 0
    the block is the attention branch alone, scaled by g1."""
    torch.manual_seed(2)
    block = ViTBlock(8, 2, layer_scale_init=0.5).eval()
    with torch.no_grad():
        block.ls2.gamma.zero_()
        x = torch.randn(1, 6, 8)
        got = block(x, (2, 3))
        want = x + 0.5 * block.attn(block.norm1(x), (2, 3))
        torch.testing.assert_close(got, want, atol=_F32_ATOL, rtol=0)


@pytest.mark.parametrize('interp', ['dinov2', 'dinov2-reg'])
def test_dinov2_tables_of_a_padded_batch_have_finite_gradients(interp):
    """Each image's table resampled to its own extent; the rows past it are
    padding (masked): forward and backward finite, the table's gradient
    from the valid rows only."""
    model = _cpvt(pos_encoding='learnable', use_cls_token=True,
                  num_register_tokens=2, img_size=48, patch_size=8,
                  pos_embed_interp=interp).train()
    x = torch.randn(2, 3, 40, 72)
    mask = torch.ones(2, 40, 72, dtype=torch.bool)
    mask[0, :40, :72] = False
    mask[1, :17, :30] = False
    (out, ) = model(x, padding_mask=mask)
    out.square().sum().backward()
    assert torch.isfinite(model.pos_embed.grad).all()
    assert model.pos_embed.grad.abs().sum() > 0
