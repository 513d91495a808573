"""tools/model_converters/dinov2_to_mmpe.py (key map in
mmpe/models/utils/dinov2_weights.py): DINOv2 ViT-S/B/L with and without
registers.

The reference is the authors' ``DinoVisionTransformer``
(facebookresearch/dinov2) run by ``tools/model_converters/
record_authors_vits.py`` on small models with weights from a rule of each
parameter's name and shape; its recorded tokens are in
tests/data/foundation_vits/. Here the same weights are rebuilt by the rule in
the authors' key layout (written from their ``vision_transformer.py`` and
``layers/``), converted, and the CPVT they configure must compute the
recorded tokens at the pretraining size (518 px, 37 x 37) and a non-square
detection size, also inside a padded batch.
"""
import pytest
import torch

from foundation_vits import (build, crop_tokens, dinov2_shapes, fixture,
                             load_tool, normed_tokens, padded_pair, record,
                             run_tool)
from mmpe.models.backbones import CPVT
from mmpe.models.utils.checkpoint_keys import CheckpointMismatch
from mmpe.models.utils.dinov2_weights import dinov2_to_mmpe

tool = load_tool('dinov2_to_mmpe')

# float32 through two blocks: the authors' SDPA and their table resampled by
# F.interpolate against mmpe's attention and per-axis weight matrices
# (PyTorch's float32 bicubic places its samples to ~1e-6)
_F32_ATOL = 1e-5
# a wrong setting (the other model's table resampling, a weight off by 1 %)
# moves the tokens by far more than rounding
_CONTROL_MIN = 1e-3
HUB = {  # the hub's widths: depth, heads
    'vits14': (384, 12, 6), 'vitb14': (768, 12, 12), 'vitl14': (1024, 24, 16)
}


def _converted(name):
    arch, data = fixture(name)
    shapes = dinov2_shapes(arch['embed_dim'], arch['depth'],
                           arch['num_register_tokens'])
    sd, config = dinov2_to_mmpe(record.rule_weights(shapes),
                                num_heads=arch['num_heads'])
    return sd, config, data


@pytest.mark.parametrize('name', ['dinov2_small', 'dinov2_small_reg'])
def test_converted_model_computes_the_authors_tokens(name):
    """At 518 x 518 (the table's own grid) and 392 x 602 (28 x 43, the table
    resampled with the model's own settings): every token, class token and
    registers included; the other model's resampling differs."""
    sd, config, data = _converted(name)
    model = build(config, sd)
    other = build(config, sd, pos_embed_interp='dinov2' if 'reg' in name
                   else 'dinov2-reg')
    for height, width in record.DINOV2_SIZES:
        expected = torch.from_numpy(data[f'tokens_{height}x{width}'])
        image = record.rule_input(height, width)
        torch.testing.assert_close(normed_tokens(model, image), expected,
                                   rtol=0, atol=_F32_ATOL)
        if (height, width) != (518, 518):
            diff = (normed_tokens(other, image) - expected).abs().max()
            assert diff > _CONTROL_MIN


def test_a_wrong_weight_differs():
    sd, config, data = _converted('dinov2_small')
    sd['blocks.1.ls2.gamma'] = sd['blocks.1.ls2.gamma'] * 1.01
    diff = (normed_tokens(build(config, sd), record.rule_input(518, 518)) -
            torch.from_numpy(data['tokens_518x518'])).abs().max()
    assert diff > _CONTROL_MIN


@pytest.mark.parametrize('name', ['dinov2_small', 'dinov2_small_reg'])
def test_an_image_in_a_padded_batch_gets_the_authors_tokens(name):
    """392 x 602 padded to 518 x 644 beside a larger image, with the pixel
    mask: its table is resampled to its own 28 x 43 grid, the padding is
    never attended to, so its tokens are the authors' of the image alone."""
    sd, config, data = _converted(name)
    model = build(config, sd)
    images, mask = padded_pair(record.rule_input(392, 602), (518, 644),
                               (500, 644))
    tokens = normed_tokens(model, images, mask)[0]
    torch.testing.assert_close(
        crop_tokens(tokens, model.num_skip, (37, 46), (28, 43)),
        torch.from_numpy(data['tokens_392x602'])[0], rtol=0, atol=_F32_ATOL)


def test_windows_without_prefix_tokens_run_and_one_window_is_global():
    """``drop_prefix_tokens``: the windowed backbone (no class / register
    tokens) loads strictly; a window covering the grid computes the global
    blocks' tokens, forward and backward."""
    arch = fixture('dinov2_small_reg')[0]
    sd, config = dinov2_to_mmpe(
        record.rule_weights(dinov2_shapes(arch['embed_dim'], arch['depth'],
                                          4)), drop_prefix_tokens=True,
        num_heads=arch['num_heads'])
    plain = build(config, sd)
    windowed = build(config, sd, window_size=43, global_blocks=(1, ))
    image = record.rule_input(392, 602).requires_grad_()
    out = windowed(image)[0]
    torch.testing.assert_close(out, plain(image)[0], rtol=0, atol=_F32_ATOL)
    out.square().sum().backward()
    assert image.grad.abs().sum() > 0
    small = build(config, sd, window_size=14, global_blocks=(1, ))
    assert (small(image)[0] - out).abs().max() > _CONTROL_MIN


@pytest.mark.parametrize('hub, registers', [('vits14', 0), ('vits14', 4),
                                            ('vitl14', 0)])
def test_hub_layouts_convert_every_key(hub, registers):
    """ViT-S with and without registers, ViT-L without (B and L with
    registers, tokens dropped: tests/test_configs/
    test_foundation_vit_configs.py)."""
    dims, depth, heads = HUB[hub]
    shapes = dinov2_shapes(dims, depth, registers)
    sd = {k: torch.empty(s, device='meta') for k, s in shapes.items()}
    out, config = dinov2_to_mmpe(sd)
    assert config['arch'] == dict(embed_dims=dims, depth=depth,
                                  num_heads=heads, mlp_ratio=4.0)
    assert (config['img_size'], config['patch_size']) == (518, 14)
    assert config['num_register_tokens'] == registers
    assert config['pos_embed_interp'] == ('dinov2-reg' if registers else
                                          'dinov2')
    assert 'mask_token' not in out and len(out) == len(sd) - 1
    assert out['patch_embed.weight'].shape == (dims, 3, 14, 14)
    with torch.device('meta'):
        model = CPVT(**{k: v for k, v in config.items() if k != 'type'})
    assert set(model.state_dict()) == set(out)


def test_cli_converts(tmp_path, monkeypatch, capsys):
    shapes = dinov2_shapes(32, 1, 4, grid=4)
    (status, out, err), dst = run_tool(tool, tmp_path,
                                       record.rule_weights(shapes),
                                       monkeypatch, capsys, '--num-heads', '2')
    assert status == 0, err
    saved = torch.load(dst, weights_only=True)
    assert saved['meta']['config']['num_register_tokens'] == 4
    assert 'register_tokens' in saved['state_dict']
    assert "pos_embed_interp': 'dinov2-reg'" in out


@pytest.mark.parametrize('change, named', [
    (lambda sd: sd.pop('blocks.0.ls2.gamma'), "'blocks.0.ls2.gamma'"),
    (lambda sd: sd.update({'storage_tokens': torch.zeros(1, 4, 32)}),
     "'storage_tokens'"),
])
def test_cli_refuses_other_files_in_one_line(tmp_path, monkeypatch, capsys,
                                             change, named):
    """Missing keys or another model's keys (DINOv3's storage tokens): one
    line naming them, exit status 2, nothing written."""
    sd = record.rule_weights(dinov2_shapes(32, 1, 0, grid=4))
    change(sd)
    (status, _, err), dst = run_tool(tool, tmp_path, sd, monkeypatch, capsys,
                                     '--num-heads', '2')
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0]
    assert not dst.exists()


def test_other_widths_need_their_heads():
    sd = {k: torch.empty(s, device='meta')
          for k, s in dinov2_shapes(200, 2, 0).items()}
    with pytest.raises(CheckpointMismatch, match='width 200 .* num_heads'):
        dinov2_to_mmpe(sd)
    assert dinov2_to_mmpe(sd, num_heads=5)[1]['arch']['num_heads'] == 5
