"""RoPE token coordinates (``mmpe/models/layers/encodings/rope_coords.py``):
DINOv3's normalised patch centres per image of a padded batch, its training-time
augmentations, and the rotary tables built from them.

Expected values come from loops written here from DINOv3's definition
(facebookresearch/dinov3, ``RopePositionEmbedding.forward``: patch centres
``(i + 0.5) / n``, mapped to ``[-1, 1]``; ``n`` the axis, the longer or the
shorter side; shift, then per-axis jitter, then shared rescale, each drawn
once per call), from timm's port (``RotaryEmbeddingDinoV3``, timm 1.0.31,
which matches the original numerically), and from integer-index tables
written here one angle at a time from the RoPE-2D and RoPE-Mixed equations
(Heo et al., ECCV 2024, Eq. 10-11 and Sec. 3.3).
"""
import math
from functools import lru_cache

import pytest
import torch

from dinov3_reference import dinov3_coords
from mmpe.models.layers import RoPE2D, RoPEMixed, apply_rope2d
from mmpe.models.layers.encodings.rope_coords import (NORMALIZED_SCALE,
                                                      RoPECoords,
                                                      augment_coords,
                                                      index_coords,
                                                      normalized_coords,
                                                      valid_extent)

_F64_ATOL = 1e-12  # float64, a few divisions
_F32_ATOL = 1e-6  # float32 coordinates in [-2, 2]: a few ulps
# float32 angles up to 2 pi * 2 (rescale 2): cos/sin of rounded angles
_TRIG_ATOL = 1e-5
# float32 angles of integer positions up to ~60 rad (RoPE-Mixed on a
# 25 x 32 grid): rounded to ~4e-6 each, passed on to cos / sin
_F32_TABLE_ATOL = 2e-5


def _padding_mask(shapes, hw):
    """(B, h * w) True outside each image's top-left (rows, cols)."""
    h, w = hw
    mask = torch.ones(len(shapes), h, w, dtype=torch.bool)
    for i, (rows, cols) in enumerate(shapes):
        mask[i, :rows, :cols] = False
    return mask.flatten(1)


@pytest.mark.parametrize('normalize', ['separate', 'max', 'min'])
def test_normalized_coords_equal_dinov3_per_image(normalize):
    """Each image of a padded batch gets DINOv3's coordinates of its own
    valid grid; padded tokens continue that grid."""
    hw, shapes = (7, 9), [(7, 9), (4, 9), (7, 3), (2, 5)]
    mask = _padding_mask(shapes, hw)
    extent = valid_extent(mask, hw)
    assert extent.tolist() == [list(s) for s in shapes]
    got = normalized_coords(hw, extent, normalize, dtype=torch.float64)
    assert got.shape == (4, 63, 2)
    for i, (rows, cols) in enumerate(shapes):
        grid = got[i].view(7, 9, 2)
        want = dinov3_coords(rows, cols, normalize).view(rows, cols, 2)
        torch.testing.assert_close(grid[:rows, :cols], want,
                                   atol=_F64_ATOL, rtol=0)
        # the padded rows / columns keep the image's spacing
        step = grid[1, 1] - grid[0, 0]
        far = grid[0, 0] + step * torch.tensor([6., 8.], dtype=torch.float64)
        torch.testing.assert_close(grid[-1, -1], far, atol=_F64_ATOL, rtol=0)
    # DINOv3's ranges: 'separate' spans [-1 + 1/n, 1 - 1/n] on both axes;
    # 'max' the longer side so, the shorter starts at the same -1 + 1/n;
    # 'min' the shorter side so, the longer goes past 1
    alone = normalized_coords((4, 9), None, normalize, dtype=torch.float64)
    top_left, bottom_right = alone[0, 0], alone[0, -1]
    first = dict(separate=(-3 / 4, -8 / 9), max=(-8 / 9, -8 / 9),
                 min=(-3 / 4, -3 / 4))[normalize]
    last = dict(separate=(3 / 4, 8 / 9), max=(-8 / 9 + 2 * 3 / 9, 8 / 9),
                min=(3 / 4, -3 / 4 + 2 * 8 / 4))[normalize]
    torch.testing.assert_close(top_left.tolist(), list(first))
    torch.testing.assert_close(bottom_right.tolist(), list(last))


@pytest.mark.parametrize('normalize', ['separate', 'max', 'min'])
def test_normalized_coords_equal_timm_dinov3_grid(normalize, timm):
    """timm's DINOv3 port builds the same grid (float32) for one image."""
    from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3
    for hw in [(5, 8), (8, 5), (16, 16), (1, 3)]:
        rope = RotaryEmbeddingDinoV3(16, normalize_coords=normalize)
        # timm's coordinate grid, read back through its public embedding:
        # sin/cos of 2 pi coords / periods; period 0 is base ** 0 = 1
        emb = rope.get_embed(list(hw))  # (h * w, 2 * 16): [sin | cos]
        sin0 = emb[:, [0, 4]]  # frequency 0 of the y and x quarters
        cos0 = emb[:, [16, 20]]
        ours = normalized_coords(hw, None, normalize)[0]
        torch.testing.assert_close(torch.sin(2 * math.pi * ours), sin0,
                                   atol=_TRIG_ATOL, rtol=0)
        torch.testing.assert_close(torch.cos(2 * math.pi * ours), cos0,
                                   atol=_TRIG_ATOL, rtol=0)


def test_valid_extent_reads_mmdets_nearest_resized_mask():
    """The extent of a mask made as mmdet's DETR makes it (nearest resize
    of the pixel mask to the feature grid): feature row i samples pixel
    row 8 i (64 / 8), so 40 valid pixel rows give rows 0..4 (5), 57 give
    all 8; 23 of 80 columns give columns 0..2 (3). These are also the
    counts mmdet's sine encoding divides by (the last values of its
    cumulative sums of the unpadded tokens)."""
    import torch.nn.functional as F
    pixels = torch.ones(3, 64, 80)
    for i, (h, w) in enumerate([(64, 80), (40, 80), (57, 23)]):
        pixels[i, :h, :w] = 0
    feat_mask = F.interpolate(pixels[:, None], size=(8, 10))[:, 0].bool()
    extent = valid_extent(feat_mask.flatten(1), (8, 10))
    assert extent.tolist() == [[8, 10], [5, 10], [8, 3]]
    not_mask = ~feat_mask
    assert extent[:, 0].tolist() == not_mask.cumsum(1)[:, -1, 0].tolist()
    assert extent[:, 1].tolist() == not_mask.cumsum(2)[:, 0, -1].tolist()


def _dinov3_augment(coords, shift, jitter, rescale):
    """DINOv3's augmentation of (N, 2) coords, its order and draws: shift
    (2 uniform draws), jitter (2 log-uniform), rescale (1 log-uniform),
    each only when given (None: off), float32 on the CPU."""
    if shift is not None:
        coords = coords + torch.empty(2).uniform_(-shift, shift)[None]
    if jitter is not None:
        j = math.log(jitter)
        coords = coords * torch.empty(2).uniform_(-j, j).exp()[None]
    if rescale is not None:
        r = math.log(rescale)
        coords = coords * torch.empty(1).uniform_(-r, r).exp()
    return coords


AUGMENTS = [(0.2, None, None), (None, 1.5, None), (None, None, 2.),
            (0.1, 1.2, 2.)]


@pytest.mark.parametrize('shift,jitter,rescale', AUGMENTS)
def test_augmentation_equals_dinov3_under_a_seed(shift, jitter, rescale):
    hw, shapes = (6, 8), [(6, 8), (3, 5)]
    mask = _padding_mask(shapes, hw)
    module = RoPECoords('normalized', 'separate', shift or 0., jitter or 1.,
                        rescale or 1.).train()
    torch.manual_seed(7)
    got = module(hw, mask)
    torch.manual_seed(7)
    plain = normalized_coords(hw, valid_extent(mask, hw))
    # one draw for the batch: both images move together (DINOv3: one
    # draw per forward)
    want = _dinov3_augment(plain.reshape(-1, 2), shift, jitter, rescale)
    want = want.view(2, 48, 2) * NORMALIZED_SCALE
    torch.testing.assert_close(got, want, atol=_F32_ATOL, rtol=0)
    assert not torch.allclose(got, plain * NORMALIZED_SCALE)
    # the same seed again: the same positions; another seed: others
    torch.manual_seed(7)
    assert torch.equal(module(hw, mask), got)
    torch.manual_seed(8)
    assert not torch.equal(module(hw, mask), got)


@pytest.mark.parametrize('shift,jitter,rescale', AUGMENTS)
def test_augmentation_equals_timm_dinov3(shift, jitter, rescale, timm):
    """timm's RotaryEmbeddingDinoV3 in training, same seed: the same
    augmented coordinates (its frequency-0 pair holds sin / cos of
    2 pi coords)."""
    from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3
    hw = (5, 7)
    theirs = RotaryEmbeddingDinoV3(
        16, shift_coords=shift, jitter_coords=jitter,
        rescale_coords=rescale).train()
    torch.manual_seed(3)
    emb = theirs.get_embed(list(hw))
    ours = RoPECoords('normalized', shift=shift or 0., jitter=jitter or 1.,
                      rescale=rescale or 1.).train()
    torch.manual_seed(3)
    pos = ours(hw)[0]
    torch.testing.assert_close(torch.sin(pos), emb[:, [0, 4]],
                               atol=_TRIG_ATOL, rtol=0)
    torch.testing.assert_close(torch.cos(pos), emb[:, [16, 20]],
                               atol=_TRIG_ATOL, rtol=0)


def test_augmentations_are_off_in_eval_and_draw_nothing():
    hw, mask = (6, 8), _padding_mask([(6, 8), (3, 5)], (6, 8))
    module = RoPECoords('normalized', 'max', shift=0.5, jitter=2.,
                        rescale=2.).eval()
    state = torch.get_rng_state()
    got = module(hw, mask)
    assert torch.equal(torch.get_rng_state(), state)  # no draw
    want = normalized_coords(hw, valid_extent(mask, hw), 'max')
    assert torch.equal(got, want * NORMALIZED_SCALE)
    # index coordinates in eval: None, i.e. the rotary modules' own tables
    assert RoPECoords('index', rescale=2.).eval()(hw, mask) is None
    assert RoPECoords('index').train()(hw, mask) is None


def test_index_coordinates_can_be_augmented_in_training():
    module = RoPECoords('index', shift=1., rescale=2.).train()
    torch.manual_seed(0)
    got = module((3, 4))
    torch.manual_seed(0)
    want = _dinov3_augment(index_coords((3, 4)).double(), 1., None, 2.)
    torch.testing.assert_close(got.double(), want, atol=_F32_ATOL, rtol=0)


def test_augmentation_ranges():
    """Shift uniform in [-s, s], jitter and rescale factors log-uniform in
    [1/j, j] and [1/r, r] (the extremes approached over many draws)."""
    ones = torch.ones(1, 2)
    torch.manual_seed(0)
    shifts = torch.cat([augment_coords(ones, shift=0.3) - 1
                        for _ in range(2000)])
    jitters = torch.cat([augment_coords(ones, jitter=1.5).log()
                         for _ in range(2000)])
    rescales = torch.cat([augment_coords(ones, rescale=2.).log()
                          for _ in range(2000)])
    for values, bound in ((shifts, 0.3), (jitters, math.log(1.5)),
                          (rescales, math.log(2.))):
        assert values.abs().max() <= bound + 1e-6
        assert values.max() > 0.98 * bound and values.min() < -0.98 * bound
        # uniform: the mean of |v| is half the bound
        assert abs(values.abs().mean() / bound - 0.5) < 0.03
    # per axis for shift and jitter, one factor for both axes for rescale
    assert not torch.equal(shifts[:, 0], shifts[:, 1])
    assert not torch.equal(jitters[:, 0], jitters[:, 1])
    torch.testing.assert_close(rescales[:, 0], rescales[:, 1])


# ---------------------------------------------------------------------------
# the rotary tables of given positions
# ---------------------------------------------------------------------------
def _cos_sin(angles):
    """Python-float cos and sin of nested lists of angles, as float64
    tensors."""
    def each(fn, a):
        return [each(fn, x) for x in a] if isinstance(a, list) else fn(a)

    return (torch.tensor(each(math.cos, angles), dtype=torch.float64),
            torch.tensor(each(math.sin, angles), dtype=torch.float64))


@lru_cache(maxsize=None)
def _rope2d_loop(hw, head_dim, theta):
    """RoPE-Axial (Heo et al., Eq. 10-11) of integer positions, token by
    token and pair by pair in Python floats: the token in row r and column
    c turns pair ``(j, j + Q)`` (``Q = D / 4``) by ``c theta^(-j / Q)``
    and pair ``(2 Q + j, 3 Q + j)`` by ``r theta^(-j / Q)``. ``(h w, D)``
    cos and sin, float64."""
    q = head_dim // 4
    angles = [[0.] * head_dim for _ in range(hw[0] * hw[1])]
    for r in range(hw[0]):
        for c in range(hw[1]):
            for j in range(q):
                freq = theta**(-j / q)
                for ch, angle in ((j, c * freq), (q + j, c * freq),
                                  (2 * q + j, r * freq),
                                  (3 * q + j, r * freq)):
                    angles[r * hw[1] + c][ch] = angle
    return _cos_sin(angles)


def _rope_mixed_loop(freqs, hw):
    """RoPE-Mixed (Heo et al., Sec. 3.3) of integer positions, one angle
    at a time: head h turns pair t by ``theta^x_{h,t} c + theta^y_{h,t} r``
    (``freqs[0]`` and ``freqs[1]``, ``(H, D / 2)``); pair ``t < D / 4``
    is channels ``(t, t + D / 4)``, pair ``D / 4 + t`` channels
    ``(D / 2 + t, 3 D / 4 + t)``. ``(H, h w, D)`` cos and sin, float64."""
    heads, half = freqs.shape[1:]
    q = half // 2
    fx, fy = freqs[0].tolist(), freqs[1].tolist()
    angles = [[[0.] * 2 * half for _ in range(hw[0] * hw[1])]
              for _ in range(heads)]
    for h in range(heads):
        for r in range(hw[0]):
            for c in range(hw[1]):
                for t in range(half):
                    first = t if t < q else half + t - q
                    for ch in (first, first + q):
                        angles[h][r * hw[1] + c][ch] = (fx[h][t] * c +
                                                        fy[h][t] * r)
    return _cos_sin(angles)


@pytest.mark.parametrize('hw', [(1, 1), (3, 5), (16, 6), (25, 32)])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_index_tables_equal_the_equations(hw, dtype):
    """The tables of integer positions (the default, cached; and given
    explicitly) are the RoPE-2D and RoPE-Mixed equations' (loops above)."""
    atol = _F64_ATOL if dtype == torch.float64 else _F32_TABLE_ATOL
    for head_dim in (8, 16, 32):
        got = RoPE2D(head_dim, 100.)(hw, torch.device('cpu'), dtype)
        want = _rope2d_loop(hw, head_dim, 100.)
        for g, w in zip(got, want):
            assert g.dtype == dtype
            torch.testing.assert_close(g.double(), w, atol=atol, rtol=0)
        torch.manual_seed(0)
        mixed = RoPEMixed(head_dim, 4)
        got = mixed(hw, dtype=dtype)
        # the float32 parameters' values, exactly
        want = _rope_mixed_loop(mixed.freqs.detach().double(), hw)
        for g, w in zip(got, want):
            assert g.dtype == dtype
            torch.testing.assert_close(g.double(), w, atol=atol, rtol=0)
        # integer positions given explicitly: the same tables
        pos = index_coords(hw, dtype=dtype)
        assert all(torch.equal(g, w) for g, w in zip(
            mixed(hw, dtype=dtype, pos=pos), got))


@pytest.mark.parametrize('normalize', ['separate', 'max', 'min'])
def test_rope2d_of_normalized_positions_is_dinov3s_table(normalize, timm):
    """RoPE-2D with ``theta`` = DINOv3's ``base`` on ``2 pi p`` gives
    timm's DINOv3 tables (its channels [y | x] twice, ours [x, x, y, y]
    quarters), so rotated vectors agree once the channels are mapped."""
    from timm.layers.pos_embed_sincos import (RotaryEmbeddingDinoV3,
                                              apply_rot_embed_cat)
    d, hw = 16, (5, 7)
    q = d // 4
    emb = RotaryEmbeddingDinoV3(d, temperature=100.,
                                normalize_coords=normalize).get_embed(
                                    list(hw))
    pos = RoPECoords('normalized', normalize).eval()(hw)
    cos, sin = RoPE2D(d, 100.)(hw, torch.device('cpu'), torch.float32,
                               pos=pos)
    assert cos.shape == (1, 1, 35, d)  # one image, broadcast over heads
    # timm's layout: [y_0..y_{Q-1}, x_0..x_{Q-1}] twice (rotate-half pairs
    # (i, i + D/2)); ours: [x | x | y | y] quarters (pairs (i, i + Q))
    perm = torch.cat([torch.arange(q, 2 * q), torch.arange(3 * q, 4 * q),
                      torch.arange(0, q), torch.arange(2 * q, 3 * q)])
    torch.testing.assert_close(cos[0, 0], emb[:, d:][:, perm],
                               atol=_TRIG_ATOL, rtol=0)
    torch.testing.assert_close(sin[0, 0], emb[:, :d][:, perm],
                               atol=_TRIG_ATOL, rtol=0)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 35, d)
    theirs = apply_rot_embed_cat(x, emb, half=True)
    ours = apply_rope2d(x[..., perm], cos, sin)
    torch.testing.assert_close(ours, theirs[..., perm], atol=_TRIG_ATOL,
                               rtol=0)


def test_per_image_tables_rotate_each_image_by_its_positions():
    """(B, L, 2) positions: image b's queries rotate by image b's tables,
    as if each were alone (RoPE-2D broadcasts over heads, RoPE-Mixed has
    its own per head)."""
    torch.manual_seed(0)
    hw, d, heads = (3, 4), 8, 2
    pos = torch.randn(2, 12, 2, dtype=torch.float64)
    x = torch.randn(2, heads, 12, d, dtype=torch.float64)
    for rope in (RoPE2D(d), RoPEMixed(d, heads).double()):
        batched = apply_rope2d(
            x, *rope(hw, torch.device('cpu'), torch.float64, pos=pos))
        for b in range(2):
            alone = apply_rope2d(
                x[b:b + 1],
                *rope(hw, torch.device('cpu'), torch.float64, pos=pos[b]))
            torch.testing.assert_close(batched[b:b + 1], alone,
                                       atol=_F64_ATOL, rtol=0)


@pytest.mark.parametrize('kwargs,match', [
    (dict(coords='pixel'), r"`coords` 'pixel'.*\('index', 'normalized'\)"),
    (dict(normalize='long'),
     r"`normalize` 'long'.*\('separate', 'max', 'min'\)"),
    (dict(shift=-0.1), r'`shift` -0.1.*>= 0'),
    (dict(jitter=0.5), r'`jitter` 0.5.*>= 1'),
    (dict(rescale=0.9), r'`rescale` 0.9.*>= 1'),
    (dict(rescale=float('inf')), r'`rescale` inf.*finite'),
    (dict(shift='0.1'), r"`shift` '0.1'"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RoPECoords(**kwargs)
