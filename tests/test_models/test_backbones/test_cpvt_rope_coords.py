"""CPVT's ``rope_cfg``: RoPE-2D and RoPE-Mixed on DINOv3's normalised
coordinates (each image's valid extent from the padding mask), the
training-time augmentations, integer indices bit for bit as before, and the
build-time errors.

Expected values:

- normalised coordinates: a reference written here from DINOv3's definition
  (facebookresearch/dinov3, ``RopePositionEmbedding``: patch centres
  ``2 (i + 0.5) / n - 1`` of the image's own grid, ``n`` its rows / columns,
  longer or shorter side; angle ``2 pi p / period``), one image at a time
  on the image alone, with the rotary tables from the formulas written
  here (RoPE-2D: DINOv3's periods ``theta ** (j / Q)``; RoPE-Mixed: Heo et
  al.'s ``theta^x_t x + theta^y_t y`` with the block's learned
  frequencies). The blocks are the backbone's own (tested against timm /
  DeiT and, with windows, the per-window loop of ``test_cpvt_windows.py``,
  reused here);
- integer indices: the outputs recorded from the CPVT of before windows and
  coordinates, on the weights recorded with them
  (``fixtures/cpvt_global_outputs.pt``).
"""
import math

import pytest
import torch
import torch.nn.functional as F

from dinov3_reference import dinov3_coords
from mmpe.models.backbones import CPVT
from test_cpvt_windows import (GLOBAL, PATCH, RECORDED_ATOL, SMALL, WINDOW,
                               LoopWindows, _global_model, _recorded_input,
                               recorded_global_model)
from test_cpvt_windows import _padded_batch as windows_padded_batch

_F64_ATOL = 1e-10  # float64: the same sums in another order
NORMALIZE = ('separate', 'max', 'min')


def _model(kind, window_size=0, seed=0, **rope_cfg):
    torch.manual_seed(seed)
    model = CPVT(
        arch=SMALL, patch_size=PATCH, img_size=32, out_indices=(0, 1, 2),
        pos_encoding=kind, window_size=window_size,
        global_blocks=GLOBAL if window_size else (),
        rope_cfg=rope_cfg or None)
    return model.double().eval()


# --------------------------------------------------------------------------
# the reference: DINOv3's positions and the tables' formulas, image alone
# --------------------------------------------------------------------------
def rope2d_reference(coords, head_dim, theta):
    """DINOv3's axial table: pair j of ``Q = D / 4`` per axis turns by
    ``2 pi p / theta ** (j / Q)``, in the channel layout of
    ``apply_rope2d`` (quarters ``[x, x, y, y]``). ``(L, D)`` each."""
    q = head_dim // 4
    periods = theta**(torch.arange(q, dtype=torch.float64) / q)
    ang_y = 2 * math.pi * coords[:, 0:1] / periods
    ang_x = 2 * math.pi * coords[:, 1:2] / periods
    angles = torch.cat([ang_x, ang_x, ang_y, ang_y], dim=-1)
    return angles.cos(), angles.sin()


def rope_mixed_reference(coords, freqs):
    """RoPE-Mixed (Heo et al., Sec. 3.3) at DINOv3's angle scale: pair t of
    head h turns by ``2 pi (theta^x_{h,t} x + theta^y_{h,t} y)``; pair
    ``t < D / 4`` in quarters (a, b), the rest in (c, d).
    ``(H, L, D)`` each."""
    fx, fy = freqs[0], freqs[1]  # (H, D/2) each
    ang = 2 * math.pi * (coords[None, :, 1:2] * fx[:, None] +
                         coords[None, :, 0:1] * fy[:, None])
    first, second = ang.chunk(2, dim=-1)
    angles = torch.cat([first, first, second, second], dim=-1)
    return angles.cos(), angles.sin()


def reference_model(model):
    """``model``'s weights in a global CPVT whose window blocks (if any)
    are the per-window loop of ``test_cpvt_windows.py``."""
    ref = _model(model.pos_encoding)
    ref.load_state_dict(model.state_dict(), strict=True)
    if model.window_size:
        for i in range(len(ref.blocks)):
            if i not in GLOBAL:
                ref.blocks[i] = LoopWindows(ref.blocks[i], WINDOW)
    return ref


def reference_forward(ref, x, normalize, theta=None):
    """The backbone's outputs on ``x`` (the images, whole) with DINOv3's
    positions of the whole token grid and the tables of the formulas."""
    b, _, H, W = x.shape
    p = ref.patch_size
    feat = ref.patch_embed(F.pad(x, (0, (-W) % p, 0, (-H) % p)))
    h, w = feat.shape[-2:]
    tokens = feat.flatten(2).transpose(1, 2)  # (B, h*w, C)
    coords = dinov3_coords(h, w, normalize)
    head_dim = ref.embed_dims // ref.num_heads
    outs = []
    for i, block in enumerate(ref.blocks):
        if ref.pos_encoding == 'rope2d':
            rope = rope2d_reference(coords, head_dim,
                                    100. if theta is None else theta)
        else:
            rope = rope_mixed_reference(coords, ref.ropes[i].freqs)
        tokens = block(tokens, (h, w), rope, None)
        outs.append(ref.norm(tokens).transpose(1, 2).reshape(b, -1, h, w))
    return outs


def _padded_batch():
    """The windows tests' padded batch (grids (5, 7) and (4, 4)) and each
    image's valid size in pixels."""
    x, mask = windows_padded_batch()
    return x, mask, [(40, 56), (29, 30)]


def _grads(model):
    return {
        k.replace('.block.', '.'): p.grad
        for k, p in model.named_parameters()
    }


def _positions_seen(model, x, mask=None):
    """The ``pos`` each rotary call gets during one forward."""
    seen = []
    modules = [model.rope] if model.rope is not None else list(model.ropes)
    hooks = [
        m.register_forward_hook(
            lambda mod, args, kwargs, out: seen.append(kwargs['pos']),
            with_kwargs=True) for m in modules
    ]
    with torch.no_grad():
        model(x, padding_mask=mask)
    for hook in hooks:
        hook.remove()
    return seen


CASES = [(kind, n, window) for kind in ('rope2d', 'rope-mixed')
         for n in NORMALIZE for window in (0, WINDOW)]


@pytest.mark.parametrize('kind,normalize,window_size', CASES)
def test_normalized_padded_batch_equals_dinov3_reference_per_image(
        kind, normalize, window_size):
    """Each image of a padded batch (with its padding mask) gets the
    reference outputs of the image alone: positions of its own valid grid.
    Forward and backward (input and every parameter, RoPE-Mixed's
    frequencies included). Rotary scores depend on position differences
    only, so the positions themselves are checked too (a shift of all of
    them would change no output)."""
    model = _model(kind, window_size, coords='normalized',
                   normalize=normalize)
    x, mask, sizes = _padded_batch()
    pos = _positions_seen(model, x, mask)[0]  # (B, h*w, 2), 2 pi p
    for i, (H, W) in enumerate(sizes):
        ht, wt = -(-H // PATCH), -(-W // PATCH)
        got = pos[i].view(5, 7, 2)[:ht, :wt].reshape(-1, 2)
        torch.testing.assert_close(
            got, 2 * math.pi * dinov3_coords(ht, wt, normalize),
            atol=_F64_ATOL, rtol=0)
    x = x.requires_grad_()
    outs = model(x, padding_mask=mask)
    g = torch.Generator().manual_seed(2)
    weights = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
    loss = 0
    ref = reference_model(model)
    ref_loss = 0
    ref_grads_x = []
    for i, (H, W) in enumerate(sizes):
        ht, wt = -(-H // PATCH), -(-W // PATCH)
        alone = x.detach()[i:i + 1, :, :H, :W].clone().requires_grad_()
        want = reference_forward(ref, alone, normalize)
        for out, ref_out, wt_ in zip(outs, want, weights):
            assert ref_out.shape[-2:] == (ht, wt)
            torch.testing.assert_close(out[i:i + 1, :, :ht, :wt], ref_out,
                                       atol=_F64_ATOL, rtol=0)
            loss = loss + (out[i, :, :ht, :wt] * wt_[i, :, :ht, :wt]).sum()
            ref_loss = ref_loss + (ref_out[0] * wt_[i, :, :ht, :wt]).sum()
        ref_grads_x.append(alone)
    loss.backward()
    ref_loss.backward()
    for i, (H, W) in enumerate(sizes):
        torch.testing.assert_close(x.grad[i, :, :H, :W],
                                   ref_grads_x[i].grad[0], atol=_F64_ATOL,
                                   rtol=0)
    want = _grads(ref)
    for key, grad in _grads(model).items():
        assert grad is not None and want[key] is not None, key
        torch.testing.assert_close(grad, want[key], atol=_F64_ATOL, rtol=0,
                                   msg=key)
    if kind == 'rope-mixed':
        assert model.ropes[0].freqs.grad.abs().max() > 0


@pytest.mark.parametrize('kind', ['rope2d', 'rope-mixed'])
@pytest.mark.parametrize('window_size', [0, WINDOW])
def test_without_a_mask_the_padded_grid_is_the_image(kind, window_size):
    """No padding mask (mmdet's plain detectors, the exported backbone):
    positions span the whole (padded) grid, as DINOv3 on that input."""
    model = _model(kind, window_size, coords='normalized', normalize='max')
    x, _, _ = _padded_batch()
    with torch.no_grad():
        outs = model(x)
        want = reference_forward(reference_model(model), x, 'max')
        for out, ref_out in zip(outs, want):
            torch.testing.assert_close(out, ref_out, atol=_F64_ATOL, rtol=0)
        # ... which differs from the positions of image 1's own extent
        masked = model(x, padding_mask=_padded_batch()[1])
        assert not torch.allclose(outs[-1][1, :, :4, :4],
                                  masked[-1][1, :, :4, :4], atol=1e-3)


def test_theta_reaches_the_normalized_tables():
    model = _model('rope2d', coords='normalized', theta=7.)
    x, mask, sizes = _padded_batch()
    with torch.no_grad():
        outs = model(x, padding_mask=mask)
        H, W = sizes[1]
        alone = x[1:2, :, :H, :W]
        want = reference_forward(reference_model(model), alone, 'separate',
                                 theta=7.)
    torch.testing.assert_close(outs[-1][1:2, :, :4, :4], want[-1],
                               atol=_F64_ATOL, rtol=0)


# --------------------------------------------------------------------------
# the training-time augmentations
# --------------------------------------------------------------------------
AUGMENT = dict(coords='normalized', shift=0.1, jitter=1.2, rescale=2.)


@pytest.mark.parametrize('kind', ['rope2d', 'rope-mixed'])
def test_augmentations_off_in_eval_and_draw_nothing(kind):
    aug = _model(kind, WINDOW, **AUGMENT).eval()
    plain = _model(kind, WINDOW, coords='normalized')
    x, mask, _ = _padded_batch()
    state = torch.get_rng_state()
    with torch.no_grad():
        got = aug(x, padding_mask=mask)
        assert torch.equal(torch.get_rng_state(), state)  # no draw
        want = plain(x, padding_mask=mask)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize('kind', ['rope2d', 'rope-mixed'])
def test_augmentations_draw_per_block_reproducible_under_a_seed(kind):
    """Training: a draw per block from torch's default generator (DINOv3's
    ViT calls its RoPE module in every block), each block's positions
    DINOv3's shift / jitter / rescale of the un-augmented positions, drawn
    here in its order, block after block; the same seed gives the same
    outputs, another seed others. (The augmentation against the authors'
    own model: tests/test_tools/test_dinov3_converter.py.)"""
    model = _model(kind, WINDOW, **AUGMENT).train()
    x, mask, sizes = _padded_batch()
    torch.manual_seed(5)
    seen = _positions_seen(model, x, mask)
    assert len(seen) == SMALL['depth']
    assert not torch.equal(seen[0], seen[1])
    # DINOv3's draws in its order, on the CPU generator, after the seed
    torch.manual_seed(5)
    for block in range(SMALL['depth']):
        shift = torch.empty(2).uniform_(-0.1, 0.1).double()
        jitter = torch.empty(2).uniform_(-math.log(1.2),
                                         math.log(1.2)).exp().double()
        rescale = torch.empty(1).uniform_(-math.log(2.),
                                          math.log(2.)).exp().double()
        for i, (H, W) in enumerate(sizes):
            ht, wt = -(-H // PATCH), -(-W // PATCH)
            coords = dinov3_coords(ht, wt, 'separate')
            want = 2 * math.pi * (coords + shift) * jitter * rescale
            got = seen[block][i].view(5, 7, 2)[:ht, :wt].reshape(-1, 2)
            # float32 draws and positions (DINOv3's), float64 here
            torch.testing.assert_close(got.double(), want, atol=1e-5,
                                       rtol=0)
    torch.manual_seed(5)
    with torch.no_grad():
        first = model(x, padding_mask=mask)
        torch.manual_seed(5)
        again = model(x, padding_mask=mask)
        torch.manual_seed(6)
        other = model(x, padding_mask=mask)
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.allclose(first[-1], other[-1], atol=1e-6)


# --------------------------------------------------------------------------
# integer indices: the backbone of before
# --------------------------------------------------------------------------
@pytest.mark.parametrize('name', ['rope2d', 'rope-mixed'])
@pytest.mark.parametrize('rope_cfg', [
    dict(coords='index'),
    dict(coords='index', normalize='max'),
    'theta',  # the default base given as rope_cfg.theta / rope_theta
], ids=['index', 'index-normalize-unused', 'theta'])
def test_index_coords_are_the_backbone_of_before(name, rope_cfg):
    """Bit for bit: the model without ``rope_cfg`` (state dict and
    outputs, in eval and in training without augmentations), and the
    outputs recorded from the CPVT of before coordinates existed, on the
    weights recorded with them."""
    theta = 100. if name == 'rope2d' else 10.
    variants = [dict(rope_cfg=rope_cfg)]
    if rope_cfg == 'theta':
        variants = [dict(rope_cfg=dict(theta=theta)),
                    dict(rope_theta=theta, rope_cfg=dict(theta=theta))]
    x, mask = _recorded_input()
    plain = _global_model(name)
    for kwargs in variants:
        # initialised as the model without `rope_cfg` ...
        model = _global_model(name, **kwargs)
        assert list(model.state_dict()) == list(plain.state_dict())
        for key, value in plain.state_dict().items():
            assert torch.equal(model.state_dict()[key], value), key
        # ... and on the recorded weights its recorded outputs
        before, record = recorded_global_model(name)
        model, _ = recorded_global_model(name, **kwargs)
        for mode in ('eval', 'train'):
            before.train(mode == 'train')
            model.train(mode == 'train')
            with torch.no_grad():
                for pm, key in ((None, 'outputs'), (mask, 'masked')):
                    outs = model(x, padding_mask=pm)
                    for a, b in zip(outs, before(x, padding_mask=pm)):
                        torch.testing.assert_close(a, b, atol=0, rtol=0)
                    torch.testing.assert_close(outs[-1], record[key],
                                               atol=RECORDED_ATOL, rtol=0)


# --------------------------------------------------------------------------
# bad input, at build time
# --------------------------------------------------------------------------
@pytest.mark.parametrize('kwargs,match', [
    (dict(rope_cfg=dict(coords='pixel')),
     r"`rope_cfg.coords` 'pixel'.*\('index', 'normalized'\)"),
    (dict(rope_cfg=dict(coords='normalized', normalize='long')),
     r"`rope_cfg.normalize` 'long'.*\('separate', 'max', 'min'\)"),
    (dict(rope_cfg=dict(shift=-0.1)), r'`rope_cfg.shift` -0.1.*>= 0'),
    (dict(rope_cfg=dict(jitter=0.5)), r'`rope_cfg.jitter` 0.5.*>= 1'),
    (dict(rope_cfg=dict(rescale=0.9)), r'`rope_cfg.rescale` 0.9.*>= 1'),
    (dict(rope_cfg=dict(coords='normalized', stretch=2.)),
     r"`rope_cfg` keys \['stretch'\].*'rope-mixed'.*\('theta', 'rotate', "
     r"'coords'"),
    (dict(rope_cfg=dict(scale=0.)), r'`rope_cfg.scale` \(0.0, 0.0\).*> 0'),
    (dict(rope_cfg=dict(window_scale=(1., -1.))),
     r'`rope_cfg.window_scale` \(1.0, -1.0\).*> 0'),
    (dict(rope_cfg='normalized'), r"`rope_cfg` 'normalized'.*dict"),
    (dict(rope_theta=10., rope_cfg=dict(theta=100.)),
     r'`rope_theta` \(10.0\) and `rope_cfg.theta` \(100.0\) conflict'),
    (dict(pos_encoding='peg', rope_cfg=dict(coords='normalized')),
     r"`rope_cfg` is only used with one of \('rope2d', 'rope-mixed'\)"),
    (dict(pos_encoding='rope2d', rope_cfg=dict(rotate=False)),
     r"`rope_cfg` keys \['rotate'\].*'rope2d'"),
    (dict(rope_cfg=dict(theta=0.)), r'`theta` must be > 0'),
])
def test_bad_rope_cfg_is_refused_at_build(kwargs, match):
    kwargs = dict(dict(pos_encoding='rope-mixed'), **kwargs)
    with pytest.raises(ValueError, match=match):
        CPVT(arch=SMALL, **kwargs)


def test_rotate_reaches_rope_mixed():
    """``rope_cfg.rotate=False`` starts every head axis-aligned (one of
    the two frequency components is 0 on every pair)."""
    model = CPVT(arch=SMALL, pos_encoding='rope-mixed',
                 rope_cfg=dict(rotate=False))
    freqs = model.ropes[0].freqs.detach()
    assert torch.all((freqs[0].abs() < 1e-7) | (freqs[1].abs() < 1e-7))
