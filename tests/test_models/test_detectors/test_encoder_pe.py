"""``encoder_pe`` in DETR, Conditional DETR and DAB-DETR: RoPE-2D and
RoPE-Mixed in the encoder self-attention, the offset biases (Swin-V2's
log-CPB, 2D ALiBi, LookHere), the learnable / absent absolute part, what
the decoder keys get, batch invariance, and the build-time errors.

Expected values come from mmdet's plain detectors with the same weights, a
per-pair loop reference of rotary attention written here from Heo et al.
(ECCV 2024, Eq. 10-11 axial, Sec. 3.3 mixed) and RoFormer's Eq. 34, the
offset biases' per-pair loops of ``tests/grid_bias_reference.py``, mmdet's
SinePositionalEncoding, and each image's encoder output alone.
"""
import copy
import math
import os.path as osp
import re

import pytest
import torch
from mmdet.models.layers import SinePositionalEncoding
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config

import mmpe  # noqa: F401
from mmpe.models.layers import PEMultiheadAttention
from mmpe.models.layers.irpe.irpe import iRPE
from mmpe.models.layers.encodings.rope_mixed import RoPEMixed

from feature_samples import feature_samples
from grid_bias_reference import alibi_loop, log_cpb_loop, lookhere_loop

ROOT = osp.join(osp.dirname(__file__), '..', '..', '..')
QUICK = osp.join(ROOT, 'configs', 'quickstart')
# quick-start config -> the mmdet detector it extends
DETECTORS = {
    'detr_rope-mixed_r18_synthetic.py': 'DETR',
    'conditional-detr_rope-mixed_r18_synthetic.py': 'ConditionalDETR',
    'dab-detr_irpe_r18_synthetic.py': 'DABDETR',
}
# float32 through 3 + 3 layers, the attention's op order differs from mmcv's
ATOL, RTOL = 1e-5, 1e-4
# float64 loop reference against the vectorised layer
REF_ATOL = 1e-10
# the same tokens with more (masked) keys in the softmax sums
INVARIANCE_ATOL = 1e-5


def _cfg(name, **encoder_pe):
    """The quick-start model config with ``encoder_pe`` replaced."""
    cfg = copy.deepcopy(Config.fromfile(osp.join(QUICK, name)).model)
    cfg.encoder_pe = dict(encoder_pe)
    return cfg


def _plain(cfg, name):
    cfg = copy.deepcopy(cfg)
    cfg.type = DETECTORS[name]
    cfg.pop('encoder_pe')
    return cfg


def _build(cfg, seed):
    torch.manual_seed(seed)
    model = MODELS.build(copy.deepcopy(cfg))
    model.init_weights()
    return model


def _batch(model, shapes, training=False):
    packed = demo_mm_inputs(
        batch_size=len(shapes), image_shapes=shapes, num_classes=4)
    return model.data_preprocessor(packed, training)


@pytest.mark.parametrize('name', DETECTORS)
def test_rope_mixed_loads_plain_and_zero_freqs_equal_plain(name):
    cfg = _cfg(name, absolute='sine', relative='rope-mixed')
    plain = _build(_plain(cfg, name), 0).eval()
    model = _build(cfg, 1).eval()
    assert type(plain).__name__ == DETECTORS[name]
    assert isinstance(model, type(plain))
    ropes = [m for m in model.modules() if isinstance(m, RoPEMixed)]
    assert len(ropes) == 3  # one per encoder layer
    # Heo et al.'s init survives the detector's Xavier init of the encoder:
    # per head, D/4 frequencies along a_h and D/4 along a_h + pi/2 with
    # magnitudes 10 ** (-4 j / D)
    head_dim = model.embed_dims // 8
    for rope in ropes:
        mags = rope.freqs.detach().norm(dim=0)  # (heads, D/2)
        quarter = head_dim // 4
        want = 10.0**(-torch.arange(quarter) * 4 / head_dim)
        torch.testing.assert_close(mags[:, :quarter], want.expand(8, -1))
        torch.testing.assert_close(mags[:, quarter:], want.expand(8, -1))

    result = model.load_state_dict(plain.state_dict(), strict=False)
    assert not result.unexpected_keys
    assert sorted(result.missing_keys) == [
        f'encoder.layers.{i}.self_attn.rope.freqs' for i in range(3)
    ]
    data = _batch(plain, [(3, 96, 160), (3, 128, 80)])
    with torch.no_grad():
        want = plain(**data, mode='tensor')
        got_random = model(**data, mode='tensor')
        for rope in ropes:
            rope.freqs.zero_()  # every angle 0: no rotation
        got = model(**data, mode='tensor')
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=RTOL)
    assert max((g - w).abs().max()
               for g, w in zip(got_random, want)) > 10 * ATOL


@pytest.mark.parametrize('name', DETECTORS)
def test_rope_trains_and_frequencies_get_gradients(name):
    for relative in ('rope2d', 'rope-mixed'):
        model = _build(_cfg(name, relative=relative), 0).train()
        data = _batch(model, [(3, 96, 160), (3, 128, 80)], training=True)
        losses = model(**data, mode='loss')
        total = sum(v for k, v in losses.items() if 'loss' in k)
        assert torch.isfinite(total)
        total.backward()
        for layer in model.encoder.layers:
            assert type(layer.self_attn.rope).__name__ == {
                'rope2d': 'RoPE2D', 'rope-mixed': 'RoPEMixed'}[relative]
        for m in model.modules():
            if isinstance(m, RoPEMixed):
                assert torch.count_nonzero(m.freqs.grad) > 0


# ---------------------------------------------------------------------------
# the rotary attention layer against a loop reference
# ---------------------------------------------------------------------------
def _pair_freqs(rope, head_dim, num_heads):
    """(fx, fy), each (heads, D/2): pair t's angle is fx x + fy y, written
    from the papers: axial (Eq. 10-11) puts pairs t < D/4 on x with
    frequency theta ** (-t / (D/4)) and the rest on y; RoPE-Mixed's pairs
    have the learned (theta^x_t, theta^y_t)."""
    quarter = head_dim // 4
    if isinstance(rope, RoPEMixed):
        return rope.freqs[0], rope.freqs[1]
    base = rope.theta**(-torch.arange(quarter, dtype=torch.float64) /
                        quarter)
    zero = torch.zeros(quarter, dtype=torch.float64)
    fx = torch.cat([base, zero]).expand(num_heads, -1)
    fy = torch.cat([zero, base]).expand(num_heads, -1)
    return fx, fy


def _rotate_loop(x, fx, fy, width, pos=None):
    """x (L, D) of one head, tokens row-major on a grid of ``width``
    columns (or at ``pos[n] = (y, x)`` when given); pair t joins channels
    (t, t + D/4) for t < D/4 and (t + D/4, t + D/2) after (two halves,
    "rotate-half" within each); (u, v) -> (u cos - v sin, v cos + u sin)
    (RoFormer Eq. 34)."""
    length, dim = x.shape
    quarter = dim // 4
    out = x.clone()
    for n in range(length):
        row, col = divmod(n, width) if pos is None else pos[n]
        for t in range(dim // 2):
            a, b = (t, t + quarter) if t < quarter else (t + quarter,
                                                         t + 2 * quarter)
            phi = fx[t] * col + fy[t] * row
            c, s = torch.cos(phi), torch.sin(phi)
            out[n, a] = x[n, a] * c - x[n, b] * s
            out[n, b] = x[n, b] * c + x[n, a] * s
    return out


def _attention_loop(layer, x, hw, key_padding_mask, pos=None):
    """mmcv-layout multi-head attention with rotated q, k, pair by pair;
    image b's tokens at ``pos[b]`` (L, 2) when given, else at their
    integer (row, column)."""
    h, w = hw
    heads, dim = layer.num_heads, layer.embed_dims
    head_dim = dim // heads
    wq, wk, wv = layer.attn.in_proj_weight.chunk(3)
    bq, bk, bv = layer.attn.in_proj_bias.chunk(3)
    fx, fy = _pair_freqs(layer.rope, head_dim, heads)
    outs = []
    for b in range(x.shape[0]):
        per_head = []
        for i in range(heads):
            sl = slice(i * head_dim, (i + 1) * head_dim)
            q = x[b] @ wq[sl].T + bq[sl]
            k = x[b] @ wk[sl].T + bk[sl]
            v = x[b] @ wv[sl].T + bv[sl]
            p = None if pos is None else pos[b]
            q = _rotate_loop(q, fx[i], fy[i], w, p)
            k = _rotate_loop(k, fx[i], fy[i], w, p)
            logits = q @ k.T / math.sqrt(head_dim)
            logits = logits.masked_fill(key_padding_mask[b][None],
                                        float('-inf'))
            per_head.append(logits.softmax(-1) @ v)
        outs.append(torch.cat(per_head, -1))
    out = layer.attn.out_proj(torch.stack(outs))
    return x + out  # mmcv's identity shortcut


@pytest.mark.parametrize('rope_cfg', [
    dict(type='rope2d', theta=100.),
    dict(type='rope-mixed', theta=10., rotate=True)
], ids=lambda c: c['type'])
def test_rotary_attention_equals_loop_reference(rope_cfg):
    torch.manual_seed(0)
    hw, dim, heads = (3, 4), 16, 2
    layer = PEMultiheadAttention(
        dim, heads, batch_first=True, rope_cfg=rope_cfg).double()
    x = torch.randn(2, hw[0] * hw[1], dim, dtype=torch.float64,
                    requires_grad=True)
    mask = torch.zeros(2, hw[0] * hw[1], dtype=torch.bool)
    mask[1, -3:] = True  # the second image's last row is padding
    got = layer(x, spatial_shape=hw, key_padding_mask=mask)
    want = _attention_loop(layer, x, hw, mask)
    torch.testing.assert_close(got, want, atol=REF_ATOL, rtol=0)
    # backward: the same gradients for the input and the frequencies
    grad = torch.randn_like(got)
    params = [x] + [p for p in layer.parameters()]
    got_grads = torch.autograd.grad(got, params, grad)
    want_grads = torch.autograd.grad(want, params, grad)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, atol=REF_ATOL, rtol=0)


@pytest.mark.parametrize('rope_cfg', [
    dict(type='rope2d', theta=100.),
    dict(type='rope-mixed', theta=10., rotate=True)
], ids=lambda c: c['type'])
def test_rotary_attention_at_given_positions_equals_loop_reference(
        rope_cfg):
    """Per-image positions (B, L, 2), e.g. normalised coordinates of a
    padded batch: every image's q and k rotate by its own positions."""
    torch.manual_seed(0)
    hw, dim, heads = (3, 4), 16, 2
    layer = PEMultiheadAttention(
        dim, heads, batch_first=True, rope_cfg=rope_cfg).double()
    x = torch.randn(2, 12, dim, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(2, 12, 2, dtype=torch.float64) * 3
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[1, -3:] = True
    got = layer(x, spatial_shape=hw, key_padding_mask=mask, rope_pos=pos)
    want = _attention_loop(layer, x, hw, mask, pos)
    torch.testing.assert_close(got, want, atol=REF_ATOL, rtol=0)
    grad = torch.randn_like(got)
    params = [x] + [p for p in layer.parameters()]
    for g, w in zip(torch.autograd.grad(got, params, grad),
                    torch.autograd.grad(want, params, grad)):
        torch.testing.assert_close(g, w, atol=REF_ATOL, rtol=0)


@pytest.mark.parametrize('relative', ['rope2d', 'rope-mixed'])
def test_rotary_scores_depend_on_the_offset_only(relative):
    """Two tokens alone (every other key masked): the first one's output is
    the same wherever the pair sits on the grid, for the same offset, and
    changes with the offset (Heo et al., Eq. 4: R_n^T R_m = R_{m - n})."""
    torch.manual_seed(0)
    hw, dim = (4, 7), 32
    layer = PEMultiheadAttention(
        dim, 4, batch_first=True, rope_cfg=dict(type=relative)).eval()
    content = torch.randn(2, dim)

    def first_output(p0, p1):
        x = torch.randn(1, hw[0] * hw[1], dim)  # the rest: noise, masked
        mask = torch.ones(1, hw[0] * hw[1], dtype=torch.bool)
        idx = [r * hw[1] + c for r, c in (p0, p1)]
        x[0, idx] = content
        mask[0, idx] = False
        with torch.no_grad():
            return layer(x, spatial_shape=hw, key_padding_mask=mask)[0,
                                                                      idx[0]]

    offset = (1, 3)
    outs = [
        first_output(p, (p[0] + offset[0], p[1] + offset[1]))
        for p in [(0, 0), (2, 1), (1, 3), (3 - 1, 7 - 4)]
    ]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-6, rtol=0)
    other = first_output((0, 0), (2, 1))
    assert (other - outs[0]).abs().max() > 1e-3


# ---------------------------------------------------------------------------
# absolute part and decoder keys
# ---------------------------------------------------------------------------
def _inputs(model, feat, img_shapes, stride=8):
    bs, _, h, w = feat.shape
    samples = feature_samples(feat, img_shapes, stride)
    return model.pre_transformer((feat, ), samples)


@pytest.mark.parametrize('decoder_pos', ['sine', 'encoder', 'none'])
def test_learnable_absolute_and_decoder_keys(decoder_pos):
    name = 'detr_rope-mixed_r18_synthetic.py'
    cfg = _cfg(name, absolute='learnable', decoder_pos=decoder_pos)
    model = _build(cfg, 0).eval()
    dim = model.embed_dims
    feat = torch.randn(2, dim, 5, 6)
    shapes = [(5, 6), (3, 4)]
    enc, dec = _inputs(model, feat, shapes)
    # DETR's learned encoding: column embedding then row embedding
    rows = model.learned_positional_encoding.row_embed.weight
    cols = model.learned_positional_encoding.col_embed.weight
    want = torch.stack([
        torch.cat([cols[n % 6], rows[n // 6]]) for n in range(30)
    ]).expand(2, -1, -1)
    torch.testing.assert_close(enc['feat_pos'], want)
    # mmdet's sine from the padding mask, as the plain DETR computes it
    mask = torch.ones(2, 5, 6, dtype=torch.bool)
    for i, (h, w) in enumerate(shapes):
        mask[i, :h, :w] = False
    sine = SinePositionalEncoding(**cfg.positional_encoding)(mask)
    sine = sine.flatten(2).transpose(1, 2)
    expected = dict(sine=sine, encoder=want, none=torch.zeros_like(want))
    torch.testing.assert_close(dec['memory_pos'], expected[decoder_pos])

    with pytest.raises(ValueError, match=r'\(5, 51\).*learnable_grid.*50'):
        _inputs(model, torch.randn(1, dim, 5, 51), [(5, 51)])


# ---------------------------------------------------------------------------
# batch invariance for every encoder choice
# ---------------------------------------------------------------------------
IRPE = dict(type='irpe', mode='contextual', method='product', ratio=1.9,
            init='xavier', on='qkv')
#: normalised RoPE coordinates (DINOv3) with DINOv3's rescale, which acts
#: in training only
NORMALIZED = {
    f'{kind}-norm-{n}': dict(type=kind, coords='normalized', normalize=n,
                             rescale=2.)
    for kind in ('rope2d', 'rope-mixed') for n in ('separate', 'max', 'min')
}
#: the offset biases (log-CPB's MLP drawn by the detector's init)
BIASES = {
    'log-cpb': dict(type='log-cpb', pretrained_size=(6, 6), hidden=32),
    'alibi-2d': dict(type='alibi-2d'),
    'lookhere': dict(type='lookhere', directions='corners'),
}
CHOICES = [(a, r) for a in ('sine', 'learnable', 'none')
           for r in (None, 'rope2d', 'rope-mixed')] + [
               ('sine', IRPE), ('none', IRPE)
           ] + [('sine', r) for r in NORMALIZED.values()] + [
               ('none', NORMALIZED['rope-mixed-norm-separate'])
           ] + [('sine', r) for r in BIASES.values()] + [
               ('none', BIASES['lookhere'])]


def _choice_id(absolute, relative):
    if isinstance(relative, dict):
        name = next((k for k, v in {**NORMALIZED, **BIASES}.items()
                     if v == relative), 'irpe')
        return f'{absolute}-{name}'
    return f'{absolute}-{relative}'


@pytest.mark.parametrize('absolute,relative', CHOICES,
                         ids=[_choice_id(a, r) for a, r in CHOICES])
@pytest.mark.parametrize('name', DETECTORS)
def test_encoder_output_does_not_depend_on_the_other_image(
        name, absolute, relative):
    """Padded batch vs each image alone, on the valid tokens. mmdet pads
    bottom/right: a token's (row, col) is the same in both, so rotations,
    relative positions and learned / normalised sine encodings agree, and
    padded keys are masked; normalised RoPE coordinates divide by each
    image's valid extent, the same alone and in the batch."""
    model = _build(_cfg(name, absolute=absolute, relative=relative), 0)
    model.eval()
    dim = model.embed_dims
    shapes = [(6, 9), (10, 5)]  # A padded at the bottom, B on the right
    torch.manual_seed(1)
    feat = torch.randn(2, dim, 10, 9)  # random padding content

    def encode(f, s):
        enc, _ = _inputs(model, f, s)
        out = model.forward_encoder(**enc)['memory']
        return out.view(f.shape[0], f.shape[2], f.shape[3], dim)

    with torch.no_grad():
        batched = encode(feat, shapes)
        for i, (h, w) in enumerate(shapes):
            alone = encode(feat[i:i + 1, :, :h, :w].contiguous(), [(h, w)])
            torch.testing.assert_close(
                batched[i, :h, :w], alone[0], atol=INVARIANCE_ATOL, rtol=0)


# ---------------------------------------------------------------------------
# build-time errors
# ---------------------------------------------------------------------------
NAME = 'detr_rope-mixed_r18_synthetic.py'


@pytest.mark.parametrize('encoder_pe,match', [
    (dict(absolute='cosine'),
     r"encoder_pe.absolute.*'cosine'.*\('sine', 'learnable', 'none'\)"),
    (dict(relative='alibi'),
     r"encoder_pe.relative.type.*'alibi'.*\('irpe', 'rope2d', 'rope-mixed', "
     r"'log-cpb', 'alibi-2d', 'lookhere'\)"),
    (dict(relative='log-cpb'),
     r"`encoder_pe.relative` of type 'log-cpb' needs `pretrained_size`"),
    (dict(relative=dict(type='alibi-2d', theta=10.)),
     r"`encoder_pe.relative` arguments \['theta'\] for type 'alibi-2d'"),
    (dict(relative=dict(type='lookhere', layer=2)),
     r"\['layer'\] for type 'lookhere'.*\('directions', 'distance', "
     r"'global_slope', 'layer_slopes'\)"),
    (dict(relative=dict(type='lookhere', directions='center')),
     r"'center'.*absolute position"),
    (dict(relative=dict(mode='contextual')), r'encoder_pe.relative.*type'),
    (dict(relative=dict(type='rope2d', ratio=1.9)),
     r"\['ratio'\].*'rope2d'.*\('theta', 'coords', 'normalize', 'shift', "
     r"'jitter', 'rescale'\)"),
    (dict(decoder_pos='learned'),
     r"encoder_pe.decoder_pos.*'learned'.*\('sine', 'encoder', 'none'\)"),
    (dict(absolute='sine', relativ='rope2d'),
     r"\['relativ'\].*\('absolute', 'relative'"),
    (dict(learnable_grid=0), r'learnable_grid.*0'),
    (dict(relative=dict(type='rope-mixed', coords='pixel')),
     r"`encoder_pe.relative.coords` 'pixel'.*\('index', 'normalized'\)"),
    (dict(relative=dict(type='rope2d', coords='normalized',
                        normalize='longer')),
     r"`encoder_pe.relative.normalize` 'longer'.*"
     r"\('separate', 'max', 'min'\)"),
    (dict(relative=dict(type='rope-mixed', shift=-0.5)),
     r'`encoder_pe.relative.shift` -0.5.*>= 0'),
    (dict(relative=dict(type='rope2d', jitter=0.9)),
     r'`encoder_pe.relative.jitter` 0.9.*>= 1'),
    (dict(relative=dict(type='rope-mixed', coords='normalized',
                        rescale=0.5)),
     r'`encoder_pe.relative.rescale` 0.5.*>= 1'),
])
def test_unknown_choices_are_refused_at_build(encoder_pe, match):
    with pytest.raises(ValueError, match=match):
        MODELS.build(_cfg(NAME, **encoder_pe))


@pytest.mark.parametrize('relative', ['rope2d', 'rope-mixed'])
def test_rope_with_head_dim_not_a_multiple_of_4_is_refused(relative):
    cfg = _cfg(NAME, relative=relative)
    cfg.encoder.layer_cfg.self_attn_cfg.num_heads = 64  # 128 / 64 = 2
    with pytest.raises(ValueError,
                       match=rf"'{relative}'.*head dim 2.*num_heads 64"):
        MODELS.build(cfg)


def test_two_places_for_the_relative_part_are_refused():
    cfg = _cfg(NAME, relative='rope2d')
    cfg.encoder.layer_cfg.self_attn_cfg.rpe_cfg = dict(mode='bias')
    with pytest.raises(ValueError, match='encoder_pe.relative.*rpe_cfg'):
        MODELS.build(cfg)
    cfg = _cfg(NAME, absolute='none')
    cfg.positional_encoding = None
    with pytest.raises(ValueError, match='positional_encoding=None'):
        MODELS.build(cfg)


def test_coordinates_in_a_layers_rope_cfg_are_refused():
    """Coordinates belong to the batch (one RoPECoords for all layers):
    the older spelling in the attention config cannot take them."""
    with pytest.raises(ValueError,
                       match=r"\['coords', 'rescale'\].*encoder_pe.relative"):
        PEMultiheadAttention(
            32, 4, rope_cfg=dict(type='rope2d', coords='normalized',
                                 rescale=2.))


def test_rope_mixed_checkpoint_of_another_head_count_is_refused():
    model = MODELS.build(_cfg(NAME, relative='rope-mixed'))
    other = _cfg(NAME, relative='rope-mixed')
    other.encoder.layer_cfg.self_attn_cfg.num_heads = 4
    state = MODELS.build(other).state_dict()
    with pytest.raises(
            ValueError,
            match=re.escape('encoder.layers.0.self_attn.rope.freqs') +
            r'.*\(2, 4, 16\).*\(2, 8, 8\)'):
        model.load_state_dict(state, strict=False)


# ---------------------------------------------------------------------------
# the offset biases (Swin-V2's log-CPB, 2D ALiBi, LookHere)
# ---------------------------------------------------------------------------
def _bias_loop(module, grid):
    """(H, L, L) of an encoder layer's bias from the per-pair loops."""
    name = type(module).__name__
    if name == 'LogCPB':
        mlp = module.cpb_mlp
        return log_cpb_loop(mlp[0].weight.double(), mlp[0].bias.double(),
                            mlp[2].weight.double(), grid,
                            module.pretrained_size)
    if name == 'ALiBi2D':
        return alibi_loop(module.num_heads, grid)
    return lookhere_loop(module.directions, module.num_heads, grid,
                         global_slope=module.global_slope,
                         layer_slopes=(module.layer_slope, ) * 2)


@pytest.mark.parametrize('bias', list(BIASES))
def test_offset_bias_layer_equals_loop_reference(bias):
    """One encoder layer (mmcv layout: in_proj, out_proj, identity
    shortcut) with a padded token, against its projections and the per-pair
    bias written from the authors' equations, float64, on the valid
    tokens."""
    torch.manual_seed(0)
    layer = PEMultiheadAttention(32, 4, batch_first=True,
                                 bias_cfg=BIASES[bias]).double()
    for p in layer.parameters():
        p.data.normal_(0, 0.3)
    grid = (3, 4)
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[1, -1] = True
    with torch.no_grad():
        got = layer(x, key_padding_mask=mask, spatial_shape=grid)
        bias_ref = _bias_loop(layer.grid_bias, grid)
        wq, wk, wv = layer.attn.in_proj_weight.chunk(3)
        bq, bk, bv = layer.attn.in_proj_bias.chunk(3)
        heads = []
        for i in range(4):
            sl = slice(8 * i, 8 * (i + 1))
            q, k, v = (x @ w[sl].T + b[sl]
                       for w, b in ((wq, bq), (wk, bk), (wv, bv)))
            logits = q @ k.transpose(-1, -2) / math.sqrt(8) + bias_ref[i]
            logits = logits.masked_fill(mask[:, None], float('-inf'))
            heads.append(logits.softmax(-1) @ v)
        want = x + layer.attn.out_proj(torch.cat(heads, -1))
    # the valid tokens (LookHere's padded query that looks only at padding
    # differs by design: grid_bias/lookhere.py)
    valid = ~mask
    torch.testing.assert_close(got[valid], want[valid], atol=REF_ATOL,
                               rtol=1e-9)
    assert torch.isfinite(got).all()


@pytest.mark.parametrize('name', DETECTORS)
def test_offset_biases_train_load_plain_weights_and_follow_the_layer(name):
    """Each bias in every encoder layer; a training step is finite and
    reaches log-CPB's MLPs (initialised as Swin-V2's, std 0.02, after the
    detector's Xavier); the plain detector's weights load with only the
    MLPs missing; LookHere's slope is the layer's entry of
    ``linspace(*layer_slopes, num_layers)``."""
    plain = _build(_plain(_cfg(name), name), 0).state_dict()
    for kind, relative in BIASES.items():
        if kind == 'lookhere':
            relative = dict(relative, layer_slopes=(2., .5))
        model = _build(_cfg(name, relative=relative), 0).train()
        biases = [layer.self_attn.grid_bias for layer in model.encoder.layers]
        missing = model.load_state_dict(plain, strict=False)
        assert not missing.unexpected_keys
        assert all('grid_bias.cpb_mlp' in k for k in missing.missing_keys)
        assert bool(missing.missing_keys) == (kind == 'log-cpb')
        if kind == 'log-cpb':
            assert 0.015 < biases[0].cpb_mlp[0].weight.std() < 0.025
        if kind == 'lookhere':
            assert [b.layer_slope for b in biases] == pytest.approx(
                [2.0, 1.25, 0.5])
        data = _batch(model, [(3, 96, 160), (3, 128, 80)], training=True)
        losses = model(**data, mode='loss')
        total = sum(v for k, v in losses.items() if 'loss' in k)
        assert torch.isfinite(total)
        total.backward()
        if kind == 'log-cpb':
            assert all(torch.count_nonzero(p.grad) > 0 for b in biases
                       for p in b.parameters())


def test_relative_part_reaches_only_the_encoder():
    model = MODELS.build(_cfg(NAME, relative=IRPE))
    names = [n for n, m in model.named_modules()
             if isinstance(m, (iRPE, RoPEMixed))]
    assert names and all(n.startswith('encoder.') for n in names)


# ---------------------------------------------------------------------------
# RoPE token coordinates
# ---------------------------------------------------------------------------
@pytest.mark.parametrize('name', DETECTORS)
def test_index_coords_give_todays_outputs_bit_for_bit(name):
    """``coords='index'`` (the default) with augmentations set: in eval the
    same numbers as the rotary setting without coordinate keys, whose
    tables are today's (``test_rope_coords.py``); no positions are made."""
    for kind in ('rope2d', 'rope-mixed'):
        today = _build(_cfg(name, relative=dict(type=kind)), 0).eval()
        keyed = _build(
            _cfg(name, relative=dict(type=kind, coords='index',
                                     normalize='max', shift=0.5, jitter=1.5,
                                     rescale=2.)), 0).eval()
        data = _batch(today, [(3, 96, 160), (3, 128, 80)])
        with torch.no_grad():
            want = today(**data, mode='tensor')
            got = keyed(**data, mode='tensor')
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        feat = torch.randn(2, today.embed_dims, 5, 6)
        # integer indices: the cached tables (no positions), also in
        # training when nothing augments them
        for model, training, pos in ((today, True, False),
                                     (keyed, False, False),
                                     (keyed, True, True)):
            enc, _ = _inputs(model.train(training), feat, [(5, 6), (3, 4)])
            assert (enc['rope_pos'] is not None) == pos


def _dinov3_positions(h, w, normalize):
    """2 pi times DINOv3's patch-centre coordinates (h * w, 2) (y, x)."""
    n = dict(separate=(h, w), max=(max(h, w), ) * 2,
             min=(min(h, w), ) * 2)[normalize]
    return torch.tensor([[2 * math.pi * (2 * (r + 0.5) / n[0] - 1),
                          2 * math.pi * (2 * (c + 0.5) / n[1] - 1)]
                         for r in range(h) for c in range(w)])


@pytest.mark.parametrize('normalize', ['separate', 'max', 'min'])
def test_normalized_positions_come_from_each_images_valid_size(normalize):
    """pre_transformer's ``rope_pos``: each image's DINOv3 coordinates of
    its own valid grid (from its ``img_shape``), whatever the padding."""
    cfg = _cfg(NAME, relative=dict(type='rope-mixed', coords='normalized',
                                   normalize=normalize))
    model = _build(cfg, 0).eval()
    shapes = [(5, 6), (3, 4), (5, 2)]
    enc, _ = _inputs(model, torch.randn(3, model.embed_dims, 5, 6), shapes)
    pos = enc['rope_pos'].view(3, 5, 6, 2)
    for i, (h, w) in enumerate(shapes):
        want = _dinov3_positions(h, w, normalize).view(h, w, 2)
        torch.testing.assert_close(pos[i, :h, :w], want, atol=1e-5, rtol=0)


def test_coordinate_augmentations_act_in_training_only_and_follow_the_seed():
    relative = dict(type='rope-mixed', coords='normalized', jitter=1.5,
                    rescale=2.)
    model = _build(_cfg(NAME, relative=relative), 0)
    feat = torch.randn(2, model.embed_dims, 5, 6)
    shapes = [(5, 6), (3, 4)]

    def encode(seed):
        torch.manual_seed(seed)
        enc, _ = _inputs(model, feat, shapes)
        with torch.no_grad():
            return enc['rope_pos'], model.forward_encoder(**enc)['memory']

    model.eval()
    plain_pos, plain = encode(0)
    assert torch.equal(encode(1)[1], plain)  # eval: no draw, no change
    model.train()
    pos, out = encode(0)
    assert torch.equal(encode(0)[1], out)  # the same seed, the same run
    assert not torch.equal(encode(1)[0], pos)
    # one draw for the batch: each axis of every image scaled by the same
    # factor (jitter per axis times the shared rescale)
    factor = pos[0, 0] / plain_pos[0, 0]  # the corner token: no zero
    torch.testing.assert_close(pos, plain_pos * factor)
    assert not torch.allclose(factor[0], factor[1])
    assert (out - plain).abs().max() > 1e-3
