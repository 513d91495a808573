"""tools/model_converters/dinov3_to_mmpe.py (key map in
mmpe/models/utils/dinov3_weights.py): DINOv3 ViT-S/B/L/16 (distilled).

The reference is the authors' ``DinoVisionTransformer``
(facebookresearch/dinov3) run by ``tools/model_converters/
record_authors_vits.py`` on small models (the hub's settings: RoPE base
100 on 'separate' coordinates, rescale 2 in training, 4 storage tokens,
masked k bias, LayerScale, LayerNorm eps 1e-5) with parameters from a rule
of each name and shape, buffers from their ``init_weights``. Here the same
state dict is rebuilt (the buffers written from their
``rope_position_encoding.py`` and ``vision_transformer.py``), converted,
and the CPVT it configures must compute the recorded tokens at 224 x 224
and at a non-square detection size, inside a padded batch, and in training
mode with the coordinate augmentations drawn from the same seed.
"""
import pytest
import torch

from foundation_vits import (build, crop_tokens, dinov3_state_dict, fixture,
                             load_tool, normed_tokens, padded_pair, record,
                             run_tool)
from mmpe.models.backbones import CPVT
from mmpe.models.utils.checkpoint_keys import CheckpointMismatch
from mmpe.models.utils.dinov3_weights import (dinov3_to_mmpe,
                                              rope_channel_order)

tool = load_tool('dinov3_to_mmpe')

# float32 through two blocks: the authors' SDPA and their RoPE angles
# (2 pi c / period) against mmpe's attention and angles (2 pi c) * freq
_F32_ATOL = 1e-5
# a wrong setting (unpermuted channels, another normalisation, another
# draw) moves the tokens by far more than rounding
_CONTROL_MIN = 1e-3
HUB = {  # the hub's ViT-S/B/L/16: width, depth, heads
    'vits16': (384, 12, 6), 'vitb16': (768, 12, 12), 'vitl16': (1024, 24, 16)
}


def _converted(name, **kwargs):
    arch, data = fixture(name)
    sd = dinov3_state_dict(arch['embed_dim'], arch['depth'],
                           arch['num_heads'])
    return (*dinov3_to_mmpe(sd, **kwargs), data, sd, arch)


def test_converted_model_computes_the_authors_tokens():
    """224 x 224 and 384 x 576 (24 x 36 tokens): every token, class and
    storage tokens included; unpermuted channels and 'max' normalisation
    differ."""
    out, config, data, sd, _ = _converted('dinov3_small')
    model = build(config, out)
    unpermuted = dict(out)
    for i in range(2):
        key = f'blocks.{i}.attn.qkv.weight'
        unpermuted[key] = sd[key]
    for height, width in record.DINOV3_SIZES:
        expected = torch.from_numpy(data[f'tokens_{height}x{width}'])
        image = record.rule_input(height, width)
        torch.testing.assert_close(normed_tokens(model, image), expected,
                                   rtol=0, atol=_F32_ATOL)
        diff = (normed_tokens(build(config, unpermuted), image) -
                expected).abs().max()
        assert diff > _CONTROL_MIN
    rope_max = dict(config['rope_cfg'], normalize='max')
    diff = (normed_tokens(build(config, out, rope_cfg=rope_max), image) -
            expected).abs().max()
    assert diff > _CONTROL_MIN


@pytest.mark.parametrize('name', ['dinov3_small', 'dinov3_small_aug'])
def test_training_mode_draws_the_authors_augmentations(name):
    """Training mode after the same seed: DINOv3 draws its coordinate
    shift / jitter / rescale in every block from torch's default
    generator; mmpe draws them in the same order, so the tokens are the
    authors'. Another seed differs."""
    out, config, data, _, arch = _converted(name)
    rope_cfg = dict(config['rope_cfg'])
    if 'pos_embed_rope_shift_coords' in arch:
        rope_cfg.update(shift=arch['pos_embed_rope_shift_coords'],
                        jitter=arch['pos_embed_rope_jitter_coords'])
    model = build(config, out, rope_cfg=rope_cfg).train()
    height, width = record.DINOV3_SIZES[1]
    image = record.rule_input(height, width)
    expected = torch.from_numpy(data[f'train_tokens_{height}x{width}'])
    torch.manual_seed(record.TRAIN_SEED)
    torch.testing.assert_close(normed_tokens(model, image), expected, rtol=0,
                               atol=_F32_ATOL)
    torch.manual_seed(record.TRAIN_SEED + 1)
    assert (normed_tokens(model, image) - expected).abs().max() > \
        _CONTROL_MIN


def test_an_image_in_a_padded_batch_gets_the_authors_tokens():
    """384 x 576 padded to 448 x 640 beside a larger image, with the pixel
    mask: its coordinates are normalised by its own 24 x 36 extent."""
    out, config, data, _, _ = _converted('dinov3_small')
    model = build(config, out)
    images, mask = padded_pair(record.rule_input(384, 576), (448, 640),
                               (448, 600))
    tokens = normed_tokens(model, images, mask)[0]
    torch.testing.assert_close(
        crop_tokens(tokens, model.num_skip, (28, 40), (24, 36)),
        torch.from_numpy(data['tokens_384x576'])[0], rtol=0, atol=_F32_ATOL)


def test_windows_without_prefix_tokens_keep_full_grid_rope():
    """``drop_prefix_tokens``: the windowed backbone loads strictly and
    rotates each token by its full-grid position: a window covering the
    grid computes the global tokens, forward and backward."""
    out, config, _, _, _ = _converted('dinov3_small', drop_prefix_tokens=True)
    assert config['use_cls_token'] is False
    plain = build(config, out)
    windowed = build(config, out, window_size=36, global_blocks=(1, ))
    image = record.rule_input(384, 576).requires_grad_()
    got = windowed(image)[0]
    torch.testing.assert_close(got, plain(image)[0], rtol=0, atol=_F32_ATOL)
    got.square().sum().backward()
    assert image.grad.abs().sum() > 0


def test_channel_order_is_a_permutation_of_dinov3s_pairs():
    """mmpe's pair (t, t + Q) at x frequency t is DINOv3's (Q + t, 3Q + t),
    its y pair (2Q + t, 3Q + t) DINOv3's (t, 2Q + t): DINOv3's angles
    ``[y | x | y | x]`` and its partner ``i + D / 2``."""
    order = rope_channel_order(16)
    assert sorted(order.tolist()) == list(range(16))
    q = 4
    for t in range(q):
        assert order[q + t] == order[t] + 8  # partners D / 2 apart
        assert order[3 * q + t] == order[2 * q + t] + 8
        assert order[t] % 8 == q + t  # x angle t: DINOv3's quarter 2
        assert order[2 * q + t] % 8 == t  # y angle t: quarter 1


@pytest.mark.parametrize('hub', sorted(HUB))
def test_hub_layouts_convert_every_key(hub):
    dims, depth, heads = HUB[hub]
    sd = dinov3_state_dict(dims, depth, heads, rule=False)
    out, config = dinov3_to_mmpe(sd)
    assert config['arch'] == dict(embed_dims=dims, depth=depth,
                                  num_heads=heads, mlp_ratio=4.0)
    assert config['rope_cfg'] == dict(theta=100., coords='normalized',
                                      normalize='separate', rescale=2.)
    assert config['norm_cfg'] == dict(type='LN', eps=1e-5)
    assert config['num_register_tokens'] == 4
    with torch.device('meta'):
        model = CPVT(**{k: v for k, v in config.items() if k != 'type'})
    assert set(model.state_dict()) == set(out)


def test_cli_converts(tmp_path, monkeypatch, capsys):
    sd = dinov3_state_dict(32, 1, 2)
    (status, out, err), dst = run_tool(tool, tmp_path, sd, monkeypatch,
                                       capsys)
    assert status == 0, err
    saved = torch.load(dst, weights_only=True)
    assert 'register_tokens' in saved['state_dict']
    assert "'pos_encoding': 'rope2d'" in out


@pytest.mark.parametrize('change, named', [
    (lambda sd: sd.pop('blocks.0.attn.qkv.bias_mask'),
     "'blocks.0.attn.qkv.bias_mask'"),
    (lambda sd: sd.update(pos_embed=torch.zeros(1, 5, 32)), "'pos_embed'"),
])
def test_cli_refuses_other_files_in_one_line(tmp_path, monkeypatch, capsys,
                                             change, named):
    """Missing keys or another model's keys (DINOv2's table): one line
    naming them, exit status 2, nothing written."""
    sd = dinov3_state_dict(32, 1, 2)
    change(sd)
    (status, _, err), dst = run_tool(tool, tmp_path, sd, monkeypatch, capsys)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0]
    assert not dst.exists()


def test_periods_of_another_parametrisation_are_refused():
    sd = dinov3_state_dict(32, 1, 2)
    sd['rope_embed.periods'] = torch.tensor([0.5, 2.0])  # min / max periods
    with pytest.raises(CheckpointMismatch, match='min_period'):
        dinov3_to_mmpe(sd)
