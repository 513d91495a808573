"""Padding masks of padded detection batches: the builders against a pixel
loop, their refusals, and CPVT given the mask through its call (no state:
a later call without a mask is the plain forward).

Detectors that pass the mask: tests/test_models/test_detectors/
test_padding_aware.py."""
import pytest
import torch

from mmdet.structures import DetDataSample
from mmpe.models.backbones import CPVT
from mmpe.models.utils import (padding_mask_from_samples,
                               padding_mask_from_shapes)

SMALL = dict(embed_dims=16, depth=2, num_heads=2, mlp_ratio=2.)


def loop_mask(shapes, H, W):
    """True on padding, one pixel at a time."""
    mask = torch.zeros(len(shapes), H, W, dtype=torch.bool)
    for i, (h, w) in enumerate(shapes):
        for y in range(H):
            for x in range(W):
                mask[i, y, x] = y >= h or x >= w
    return mask


def samples(shapes, batch_shape=None):
    out = []
    for s in shapes:
        meta = dict(img_shape=tuple(s))
        if batch_shape is not None:
            meta['batch_input_shape'] = tuple(batch_shape)
        out.append(DetDataSample(metainfo=meta))
    return out


def test_padding_mask_from_shapes_matches_loop():
    shapes = [(5, 7), (9, 2), (9, 11)]
    mask = padding_mask_from_shapes(shapes, (9, 11))
    assert torch.equal(mask, loop_mask(shapes, 9, 11))


@pytest.mark.parametrize('shape', [(10, 3), (3, 12), (0, 3)])
def test_padding_mask_from_shapes_rejects_what_does_not_fit(shape):
    with pytest.raises(ValueError, match=rf'\({shape[0]}, {shape[1]}\)'):
        padding_mask_from_shapes([shape], (9, 11))


@pytest.mark.parametrize('with_batch_shape', [True, False])
def test_padding_mask_from_samples_matches_loop(with_batch_shape):
    shapes = [(5, 7), (9, 2), (9, 11)]
    x = torch.zeros(3, 3, 9, 11)
    data = samples(shapes, (9, 11) if with_batch_shape else None)
    assert torch.equal(padding_mask_from_samples(data, x),
                       loop_mask(shapes, 9, 11))


def test_padding_mask_from_samples_refuses_samples_of_other_inputs():
    x = torch.zeros(2, 3, 9, 11)
    with pytest.raises(ValueError, match='1 data samples for a batch of 2'):
        padding_mask_from_samples(samples([(9, 11)]), x)
    with pytest.raises(ValueError, match=r'batch of \(18, 22\).*\(9, 11\)'):
        padding_mask_from_samples(samples([(9, 11)] * 2, (18, 22)), x)
    with pytest.raises(ValueError, match='sample 1 has no `img_shape`'):
        padding_mask_from_samples(
            [samples([(9, 11)])[0], DetDataSample()], x)
    with pytest.raises(ValueError, match=r'\(12, 11\)'):
        padding_mask_from_samples(samples([(12, 11), (9, 11)]), x)


def test_cpvt_takes_the_mask_per_call_and_keeps_nothing():
    torch.manual_seed(0)
    model = CPVT(arch=SMALL, out_indices=(0, 1)).eval()
    assert not hasattr(model, 'set_valid_shapes')
    x = torch.randn(2, 3, 48, 64)
    shapes = [(48, 30), (20, 64)]
    plain = model(x)
    masked = model(x, padding_mask=padding_mask_from_samples(
        samples(shapes, (48, 64)), x))
    expected = model(x, padding_mask=loop_mask(shapes, 48, 64))
    for out, ref in zip(masked, expected):
        torch.testing.assert_close(out, ref, atol=0, rtol=0)
    assert not torch.allclose(expected[1], plain[1])
    for out, ref in zip(model(x), plain):  # nothing kept from the last call
        torch.testing.assert_close(out, ref, atol=0, rtol=0)
