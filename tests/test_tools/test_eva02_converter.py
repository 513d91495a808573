"""tools/model_converters/eva02_to_mmpe.py (key map in
mmpe/models/utils/eva02_weights.py): EVA-02 B / L, the MIM weights the
authors publish through timm.

The reference is timm's ``Eva`` itself (tests/timm_stub.py) with EVA-02's
settings (``eva02_*_patch14_224``: unfused q / k / v, SwiGLU with sub-LN,
an absolute table and 2D RoPE on ``ref_feat_shape``), small, its weights
from the fixture rule; the converted CPVT must compute timm's tokens at the
pretraining grid and, with the RoPE positions interpolated to it, at a
non-square grid (timm's ``dynamic_img_size``: positions ``t * ref / n``,
the table resampled by ``resample_abs_pos_embed``). EVA-02's window RoPE
(detection: positions of the window grid interpolated from ``pt`` to the
window side) is tested against the global model run on each window. The
hub's B / L with the detection configs' settings:
tests/test_configs/test_foundation_vit_configs.py.
"""
import pytest
import torch

from foundation_vits import build, load_tool, normed_tokens, record, run_tool
from mmpe.models.backbones import CPVT
from mmpe.models.utils.checkpoint_keys import CheckpointMismatch
from mmpe.models.utils.eva02_weights import eva02_to_mmpe, rope_channel_order

tool = load_tool('eva02_to_mmpe')

# float32 through two blocks: timm's SDPA and RoPE against mmpe's
_F32_ATOL = 1e-5
# unpermuted channels or uninterpolated positions move the tokens far more
_CONTROL_MIN = 1e-3
# small EVA-02: patch 14, an 8 x 8 pretraining grid (112 px), head dim 16
SMALL = dict(img_size=112, patch_size=14, embed_dim=64, depth=2,
             num_heads=4, qkv_fused=False, mlp_ratio=4 * 2 / 3,
             swiglu_mlp=True, scale_mlp=True, use_rot_pos_emb=True,
             ref_feat_shape=(8, 8), num_classes=0)


def _timm_eva(timm, **kwargs):
    """timm's Eva with EVA-02's settings, weights from the fixture rule."""
    model = timm.models.eva.Eva(**dict(SMALL, **kwargs)).eval()
    buffers = {k for k, _ in model.named_buffers()}
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()
              if k not in buffers}
    model.load_state_dict(record.rule_weights(shapes), strict=False)
    return model


def _weights(model):
    buffers = {k for k, _ in model.named_buffers()}
    return {k: v for k, v in model.state_dict().items() if k not in buffers}


def _timm_tokens(model, image):
    with torch.no_grad():
        return model.forward_features(image)


@pytest.mark.parametrize('height, width', [(112, 112), (168, 252)])
def test_converted_model_computes_timms_tokens(timm, height, width):
    """At the pretraining grid (8 x 8) and at 12 x 18 (timm's dynamic size:
    RoPE positions ``t * 8 / n`` per axis, the table resampled): class and
    patch tokens; without the channel permutation or with positions not
    interpolated the tokens differ."""
    model = _timm_eva(timm, dynamic_img_size=True)
    sd = _weights(model)
    grid = (height // 14, width // 14)
    out, config = eva02_to_mmpe(sd, ft_grid=grid, num_heads=4)
    image = record.rule_input(height, width)
    expected = _timm_tokens(model, image)
    mmpe = build(config, out)
    torch.testing.assert_close(normed_tokens(mmpe, image), expected, rtol=0,
                               atol=_F32_ATOL)
    raw = dict(out)
    for i in range(2):
        raw[f'blocks.{i}.attn.qkv.weight'] = torch.cat([
            sd[f'blocks.{i}.attn.{n}_proj.weight'] for n in 'qkv'])
    assert (normed_tokens(build(config, raw), image) -
            expected).abs().max() > _CONTROL_MIN
    if grid != (8, 8):
        plain = build(config, out, rope_cfg=dict(theta=10000.))
        assert (normed_tokens(plain, image) - expected).abs().max() > \
            _CONTROL_MIN


def test_window_rope_is_the_window_grids():
    """Window blocks (``window_scale = pt / S``) compute, on each window,
    what the global blocks compute on that window's crop with the positions
    interpolated to ``(S, S)`` (EVA-02's window RoPE of ``ft_seq_len =
    S``): one block, no class token, no table."""
    torch.manual_seed(0)
    common = dict(arch=dict(embed_dims=32, depth=1, num_heads=2,
                            mlp_ratio=2.), patch_size=8,
                  pos_encoding='rope2d', block_cfg=dict(
                      mlp_type='swiglu-subln'))
    windowed = CPVT(**common, window_size=4, rope_cfg=dict(
        theta=10000., scale=8 / 12, window_scale=8 / 4)).eval()
    windowed.load_state_dict(record.rule_weights(
        {k: tuple(v.shape) for k, v in windowed.state_dict().items()}))
    crop = CPVT(**common, rope_cfg=dict(theta=10000., scale=8 / 4)).eval()
    crop.load_state_dict(windowed.state_dict())
    image = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        (got, ) = windowed(image)
        for r in range(2):
            for c in range(3):
                (want, ) = crop(image[..., 32 * r:32 * (r + 1),
                                      32 * c:32 * (c + 1)])
                torch.testing.assert_close(
                    got[..., 4 * r:4 * (r + 1), 4 * c:4 * (c + 1)], want,
                    rtol=0, atol=_F32_ATOL)
        other = CPVT(**common, window_size=4, rope_cfg=dict(
            theta=10000., scale=8 / 12)).eval()
        other.load_state_dict(windowed.state_dict())
        assert (other(image)[0] - got).abs().max() > _CONTROL_MIN


def test_channel_order_is_timms_interleaved_pairs():
    order = rope_channel_order(16)
    assert sorted(order.tolist()) == list(range(16))
    for t in range(4):
        assert order[4 + t] == order[t] + 1  # interleaved partners
        assert order[12 + t] == order[8 + t] + 1
        assert order[t] // 2 == 4 + t  # x band t: timm's second half
        assert order[8 + t] // 2 == t  # y band t: the first


def test_cli_converts(tmp_path, monkeypatch, capsys, timm):
    sd = _weights(_timm_eva(timm, depth=1))
    (status, out, err), dst = run_tool(
        tool, tmp_path, sd, monkeypatch, capsys, '--num-heads', '4',
        '--ft-grid', '64', '64', '--window-size', '16',
        '--drop-prefix-tokens')
    assert status == 0, err
    saved = torch.load(dst, weights_only=True)
    assert 'cls_token' not in saved['state_dict']
    assert "'window_scale': 0.5" in out


@pytest.mark.parametrize('change, named', [
    (lambda sd: sd.pop('blocks.0.mlp.norm.weight'),
     "'blocks.0.mlp.norm.weight'"),
    (lambda sd: sd.update({'blocks.0.attn.qkv.weight': torch.zeros(3, 3)}),
     "'blocks.0.attn.qkv.weight'"),
])
def test_cli_refuses_other_files_in_one_line(tmp_path, monkeypatch, capsys,
                                             timm, change, named):
    sd = _weights(_timm_eva(timm, depth=1))
    change(sd)
    (status, _, err), dst = run_tool(tool, tmp_path, sd, monkeypatch, capsys,
                                     '--num-heads', '4')
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0]
    assert not dst.exists()


def test_other_widths_need_their_heads(timm):
    sd = _weights(_timm_eva(timm, depth=1))
    with pytest.raises(CheckpointMismatch, match='width 64 .* num_heads'):
        eva02_to_mmpe(sd)
