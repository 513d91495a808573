"""RT-DETR's decoder layers against slow references written here: the
deformable sampling (bilinear and nearest-cell, per point), the anchors
(the released formula, per image extent), the denoising groups' attention
mask (the released loop), the decoder's ``eval_idx`` and refinement."""
import math

import pytest
import torch

from mmpe.models.layers import (MSDeformableAttentionV2, RTDETRDecoder,
                                RTDETRDecoderLayer,
                                contrastive_denoising_groups,
                                deformable_sample, rtdetr_anchors)

#: float32 sums of a few dozen products
ATOL = 1e-5


def _bilinear(value_map, x, y):
    """One bilinear read of ``(C, h, w)`` at ``(x, y)`` in [0, 1] of the
    map (pixel centres at (j + 1/2) / w), zeros outside."""
    C, h, w = value_map.shape
    px, py = x * w - 0.5, y * h - 0.5
    x0, y0 = math.floor(px), math.floor(py)
    out = torch.zeros(C)
    for yy, wy in ((y0, 1 - (py - y0)), (y0 + 1, py - y0)):
        for xx, wx in ((x0, 1 - (px - x0)), (x0 + 1, px - x0)):
            if 0 <= yy < h and 0 <= xx < w:
                out += wx * wy * value_map[:, yy, xx]
    return out


def _nearest(value_map, x, y):
    C, h, w = value_map.shape
    j = min(max(math.floor(x * w + 0.5), 0), w - 1)
    i = min(max(math.floor(y * h + 0.5), 0), h - 1)
    return value_map[:, i, j]


def _slow_sample(value, shapes, locations, weights, num_points, method):
    B, _, H, C = value.shape
    Q = locations.shape[1]
    read = _bilinear if method == 'default' else _nearest
    out = torch.zeros(B, Q, H, C)
    for b in range(B):
        for h_ in range(H):
            start, point = 0, 0
            for (hl, wl), p in zip(shapes, num_points):
                vmap = value[b, start:start + hl * wl, h_].T.reshape(C, hl, wl)
                for k in range(point, point + p):
                    for q in range(Q):
                        x, y = locations[b, q, h_, k].tolist()
                        out[b, q, h_] += (weights[b, q, h_, k] *
                                          read(vmap, x, y))
                start += hl * wl
                point += p
    return out.reshape(B, Q, H * C)


@pytest.mark.parametrize('method', ['default', 'discrete'])
def test_deformable_sample_matches_a_loop_per_point(method):
    torch.manual_seed(0)
    shapes, num_points = [(3, 5), (2, 4)], [3, 2]
    B, H, C, Q = 2, 2, 3, 4
    value = torch.randn(B, sum(h * w for h, w in shapes), H, C)
    # points inside and outside the maps (zeros / clamped cells)
    locations = torch.rand(B, Q, H, sum(num_points), 2) * 1.4 - 0.2
    weights = torch.rand(B, Q, H, sum(num_points))
    got = deformable_sample(value, shapes, locations, weights, num_points,
                            method)
    want = _slow_sample(value, shapes, locations, weights, num_points,
                        method)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    # control: the levels' point counts swapped read other points
    other = deformable_sample(value, shapes, locations, weights, [2, 3],
                              method)
    assert not torch.allclose(other, want, atol=1e-3)


def test_discrete_clamps_each_axis_by_its_own_size():
    # a wide map: x past the right edge reads the last column, not h - 1
    value = torch.arange(2 * 6, dtype=torch.float32).reshape(1, 12, 1, 1)
    loc = torch.tensor([0.99, 0.2]).reshape(1, 1, 1, 1, 2)
    out = deformable_sample(value, [(2, 6)], loc, torch.ones(1, 1, 1, 1), [1],
                            'discrete')
    assert out.item() == 5.0  # row 0, column 5


@pytest.mark.parametrize('method', ['default', 'discrete'])
def test_deformable_attention_forward_backward(method):
    torch.manual_seed(0)
    attn = MSDeformableAttentionV2(16, 2, 2, [3, 2], method=method)
    shapes = [(4, 6), (2, 3)]
    query = torch.randn(2, 5, 16, requires_grad=True)
    value = torch.randn(2, 30, 16, requires_grad=True)
    ref = torch.rand(2, 5, 1, 4) * 0.5 + 0.25
    out = attn(query, ref, value, shapes)
    assert out.shape == (2, 5, 16)
    out.sum().backward()
    trainable = [n for n, p in attn.named_parameters() if p.requires_grad]
    if method == 'discrete':  # nearest cells: no gradient to the offsets
        assert not any(n.startswith('sampling_offsets') for n in trainable)
    for name, p in attn.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    # masked values are zeros
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, :] = False
    out = attn(query, ref, value, shapes, value_mask=mask)
    torch.testing.assert_close(out[1], attn.output_proj.bias.expand(5, -1))


def test_deformable_attention_refuses_bad_settings():
    with pytest.raises(ValueError, match='cross_attn_method'):
        MSDeformableAttentionV2(16, 2, 2, 4, method='bicubic')
    with pytest.raises(ValueError, match='num_points'):
        MSDeformableAttentionV2(16, 2, 2, [4, 4, 4])


def test_anchors_are_the_released_formula():
    shapes = [(2, 3), (1, 2)]
    logits, valid = rtdetr_anchors(shapes, eps=0.01)
    rows = []
    for level, (h, w) in enumerate(shapes):
        for i in range(h):
            for j in range(w):
                rows.append([(j + 0.5) / w, (i + 0.5) / h, 0.05 * 2**level,
                             0.05 * 2**level])
    boxes = torch.tensor(rows)[None]
    torch.testing.assert_close(logits.sigmoid(), boxes)
    assert valid.all()
    # a cell at the border is invalid, its logit +inf
    logits, valid = rtdetr_anchors([(1, 200)], eps=0.01)
    assert not valid[0, 0, 0] and torch.isinf(logits[0, 0]).all()


def test_anchors_of_a_padded_image_are_its_own():
    # image 1 is 2/4 of the width and 3/4 of the height of the batch
    ratios = torch.tensor([[1.0, 1.0], [0.5, 0.75]])
    logits, valid = rtdetr_anchors([(4, 4)], ratios)
    alone, alone_valid = rtdetr_anchors([(3, 2)])
    inside = valid[1, :, 0].reshape(4, 4)
    assert inside[:3, :2].all() and not inside[3:].any()
    assert not inside[:, 2:].any()
    torch.testing.assert_close(
        logits[1].reshape(4, 4, 4)[:3, :2].reshape(-1, 4), alone[0])
    full, _ = rtdetr_anchors([(4, 4)])
    torch.testing.assert_close(logits[0], full[0])


def test_denoising_mask_is_the_released_loop():
    embed = torch.nn.Embedding(6, 8, padding_idx=5)
    labels = [torch.tensor([1, 2]), torch.tensor([3, 4, 0])]
    boxes = [torch.rand(2, 4) * 0.3 + 0.2, torch.rand(3, 4) * 0.3 + 0.2]
    dn = contrastive_denoising_groups(labels, boxes, 5, 7, embed, 20)
    most, groups = 3, 6
    total = 2 * most * groups
    assert (dn.num_groups, dn.num_denoising) == (groups, total)
    want = torch.zeros(total + 7, total + 7, dtype=torch.bool)
    want[total:, :total] = True
    for i in range(groups):  # the released loop
        rows = slice(2 * most * i, 2 * most * (i + 1))
        if i == 0:
            want[rows, 2 * most * (i + 1):total] = True
        if i == groups - 1:
            want[rows, :most * i * 2] = True
        else:
            want[rows, 2 * most * (i + 1):total] = True
            want[rows, :2 * most * i] = True
    assert torch.equal(dn.attn_mask, want)
    # positives: the first n of each group's first half
    assert dn.positive_idx[0].tolist() == [
        g * 2 * most + k for g in range(groups) for k in range(2)]
    assert dn.content.shape == (2, total, 8)
    # a batch without boxes: one dummy query, no positives
    empty = contrastive_denoising_groups(
        [torch.zeros(0, dtype=torch.long)] * 2, [torch.zeros(0, 4)] * 2, 5,
        7, embed, 20)
    assert empty.num_denoising == 2 and empty.positive_idx[0].numel() == 0
    assert torch.isfinite(empty.boxes_unact).all()


def _decoder(eval_idx):
    torch.manual_seed(0)
    layer = RTDETRDecoderLayer(16, 2, 32, num_levels=2, num_points=2)
    dec = RTDETRDecoder(layer, 3, eval_idx)
    heads = torch.nn.ModuleList(torch.nn.Linear(16, 4) for _ in range(3))
    scores = torch.nn.ModuleList(torch.nn.Linear(16, 5) for _ in range(3))
    return dec, heads, scores, torch.nn.Linear(4, 16)


def test_decoder_eval_idx_and_refinement():
    shapes = [(4, 4), (2, 2)]
    memory = torch.randn(1, 20, 16)
    query = torch.randn(1, 6, 16)
    ref = torch.randn(1, 6, 4)
    dec, heads, scores, pos = _decoder(1)
    dec.train()
    boxes_all, logits_all = dec(query, ref, memory, shapes, heads, scores,
                                pos)
    assert boxes_all.shape == (3, 1, 6, 4)
    dec.eval()
    boxes, logits = dec(query, ref, memory, shapes, heads, scores, pos)
    assert boxes.shape == (1, 1, 6, 4)
    # inference returns layer eval_idx's outputs (dropout 0: the same)
    torch.testing.assert_close(boxes[0], boxes_all[1])
    torch.testing.assert_close(logits[0], logits_all[1])
    # control: the last layer's differ
    assert not torch.allclose(boxes[0], boxes_all[2])
    with pytest.raises(ValueError, match='eval_idx'):
        RTDETRDecoder(RTDETRDecoderLayer(16, 2, 32), 3, 3)
