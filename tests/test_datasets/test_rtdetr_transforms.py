"""RandomPhotometricDistort and RandomIoUCrop against torchvision's rules,
written here (torchvision's ``transforms/v2/_color.py``
``RandomPhotometricDistort``, ``_geometry.py`` ``RandomIoUCrop``, and the PIL
operations ``_functional_pil.py`` calls), with the RT-DETR authors' ``p``
(``rtdetrv2_pytorch/src/data/transforms/_transforms.py``)."""
import numpy as np
import pytest
import torch
from mmdet.datasets.transforms import PhotoMetricDistortion
from mmdet.structures.bbox import HorizontalBoxes

from mmpe.datasets.rtdetr_transforms import (IOU_OPTIONS,
                                             RandomIoUCrop,
                                             RandomPhotometricDistort)

# PIL rounds to 8 bits after each step
ROUNDING = 1


def _image(seed=0, h=24, w=32):
    return np.random.RandomState(seed).randint(0, 256, (h, w, 3),
                                               dtype=np.uint8)


def _grey(rgb):
    """ITU-R 601-2 luma in PIL's fixed point ("L" conversion: weights
    0.299, 0.587, 0.114 in 16 bits, rounded)."""
    rgb = rgb.astype(np.int64)
    return ((rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471
             + 0x8000) >> 16).astype(np.float64)


def _only(**step):
    params = dict(brightness=None, contrast=None, saturation=None, hue=None,
                  contrast_before=True, permutation=None)
    params.update(step)
    return params


def _apply(bgr, params):
    from PIL import Image
    out = RandomPhotometricDistort.apply(
        Image.fromarray(np.ascontiguousarray(bgr[..., ::-1])), params)
    return np.asarray(out).astype(np.float64)


def test_draws_in_torchvisions_order():
    """rand < p then uniform per factor (brightness, contrast, saturation,
    hue), rand(()) < 0.5 for the contrast's place, rand < p then randperm."""
    t = RandomPhotometricDistort(p=0.5)
    for seed in range(5):
        torch.manual_seed(seed)
        expected = {}
        for key, (low, high) in (('brightness', (0.875, 1.125)),
                                 ('contrast', (0.5, 1.5)),
                                 ('saturation', (0.5, 1.5)),
                                 ('hue', (-0.05, 0.05))):
            expected[key] = float(torch.empty(1).uniform_(
                low, high)) if float(torch.rand(1)) < 0.5 else None
        expected['contrast_before'] = bool(torch.rand(()) < 0.5)
        expected['permutation'] = torch.randperm(3).tolist() if float(
            torch.rand(1)) < 0.5 else None
        torch.manual_seed(seed)
        assert t.draw() == expected


def test_each_step_is_the_pil_operation():
    bgr = _image()
    rgb = bgr[..., ::-1].astype(np.float64)
    # brightness: a blend with black
    got = _apply(bgr, _only(brightness=1.1))
    np.testing.assert_allclose(got, np.clip(rgb * 1.1, 0, 255),
                               atol=ROUNDING)
    # contrast: a blend with the grey image's mean (rounded)
    mean = int(_grey(rgb).mean() + 0.5)
    got = _apply(bgr, _only(contrast=1.4))
    np.testing.assert_allclose(got, np.clip(mean + 1.4 * (rgb - mean), 0,
                                            255), atol=ROUNDING)
    # saturation: a blend with the grey image
    grey = _grey(rgb)[..., None]
    got = _apply(bgr, _only(saturation=0.6))
    np.testing.assert_allclose(got, np.clip(grey + 0.6 * (rgb - grey), 0,
                                            255), atol=ROUNDING)
    # permutation of the RGB channels
    got = _apply(bgr, _only(permutation=[2, 0, 1]))
    np.testing.assert_array_equal(got, rgb[..., [2, 0, 1]])
    # hue: PIL's 8-bit hue shifted by int(f * 255) mod 256
    from PIL import Image
    hsv = np.asarray(Image.fromarray(bgr[..., ::-1].copy()).convert('HSV'))
    out = _apply(bgr, _only(hue=-0.05)).astype(np.uint8)
    out_hsv = np.asarray(Image.fromarray(out).convert('HSV')).astype(int)
    saturated = (hsv[..., 1] > 128) & (hsv[..., 2] > 128)  # hue well set
    shift = (out_hsv[..., 0] - hsv[..., 0].astype(int)) % 256
    assert np.median(shift[saturated]) == (256 - 12)  # int(-12.75) = -12


def test_transform_keeps_bgr_uint8_and_control():
    bgr = _image(1)
    t = RandomPhotometricDistort(p=1.0)
    torch.manual_seed(0)
    params = t.draw()
    torch.manual_seed(0)
    out = t.transform(dict(img=bgr.copy()))['img']
    assert out.dtype == np.uint8 and out.shape == bgr.shape
    np.testing.assert_array_equal(out[..., ::-1], _apply(bgr, params))
    # control: mmdet's PhotoMetricDistortion computes something else
    np.random.seed(0)
    theirs = PhotoMetricDistortion().transform(dict(img=bgr.copy()))['img']
    assert not np.allclose(theirs, out, atol=2)
    with pytest.raises(ValueError, match='8-bit'):
        t.transform(dict(img=bgr.astype(np.float32)))


def _results(boxes, h=100, w=100):
    boxes = np.asarray(boxes, dtype=np.float32)
    return dict(
        img=_image(2, h, w),
        img_shape=(h, w),
        gt_bboxes=HorizontalBoxes(torch.from_numpy(boxes)),
        gt_bboxes_labels=np.arange(len(boxes)),
        gt_ignore_flags=np.zeros(len(boxes), dtype=bool))


def _iou(a, b):
    lt, rb = np.maximum(a[:2], b[:2]), np.minimum(a[2:], b[2:])
    inter = np.clip(rb - lt, 0, None).prod()
    return inter / ((a[2:] - a[:2]).prod() + (b[2:] - b[:2]).prod() - inter)


@pytest.mark.parametrize('seed', range(8))
def test_iou_crop_follows_torchvisions_rule(seed):
    boxes = np.array([[10, 10, 60, 50], [40, 30, 90, 95], [70, 5, 80, 15]],
                     dtype=np.float64)
    t = RandomIoUCrop(sampler_options=(0.0, 0.5, 0.7), p=1.0)
    torch.manual_seed(seed)
    out = t.transform(_results(boxes))
    h, w = out['img'].shape[:2]
    assert out['img_shape'] == (h, w)
    # 0.3-1 of each side, aspect 0.5-2
    assert 30 <= h <= 100 and 30 <= w <= 100 and 0.5 <= w / h <= 2
    # recover the crop's corner from the image
    full = _image(2, 100, 100)
    corners = [(x, y) for y in range(101 - h) for x in range(101 - w)
               if np.array_equal(full[y:y + h, x:x + w], out['img'])]
    assert len(corners) == 1
    left, top = corners[0]
    crop = np.array([left, top, left + w, top + h], dtype=np.float64)
    cx, cy = boxes[:, 0::2].mean(1), boxes[:, 1::2].mean(1)
    inside = (left < cx) & (cx < left + w) & (top < cy) & (cy < top + h)
    np.testing.assert_array_equal(out['gt_bboxes_labels'],
                                  np.flatnonzero(inside))
    expected = boxes[inside] - [left, top, left, top]
    expected[:, 0::2] = expected[:, 0::2].clip(0, w)
    expected[:, 1::2] = expected[:, 1::2].clip(0, h)
    np.testing.assert_allclose(out['gt_bboxes'].numpy(), expected,
                               atol=1e-5)
    # some kept box reaches the drawn minimum, at least the smallest option
    assert inside.any()
    assert max(_iou(b, crop) for b in boxes[inside]) >= 0.0


def test_iou_crop_takes_the_best_box_not_every_box():
    """torchvision: some box (centre inside) reaches the IoU; mmdet's
    MinIoURandomCrop: every box (the smallest IoU of all boxes). With a far
    tiny box and a minimum of 0.5, torchvision's rule takes crops that drop
    the tiny box (its IoU with any crop is below 0.5: mmdet's rule refuses
    them)."""
    boxes = [[0, 0, 80, 80], [96, 96, 99, 99]]
    t = RandomIoUCrop(sampler_options=(0.5, ), p=1.0)
    dropped = 0
    for seed in range(10):
        torch.manual_seed(seed)
        out = t.transform(_results(boxes))
        ious = [_iou(np.array(b, float), np.array(
            [0, 0, out['img'].shape[1], out['img'].shape[0]], float))
            for b in out['gt_bboxes'].numpy()]
        dropped += len(out['gt_bboxes_labels']) == 1
        assert max(ious) >= 0.5 - 1e-6 or len(ious) == 1
    assert dropped > 0


def test_iou_crop_p_and_no_crop_option():
    boxes = [[10, 10, 60, 50]]
    out = RandomIoUCrop(p=0.0).transform(_results(boxes))
    assert out['img'].shape == (100, 100, 3)
    out = RandomIoUCrop(sampler_options=(1.0, )).transform(_results(boxes))
    assert out['img'].shape == (100, 100, 3)
    assert IOU_OPTIONS == (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)


@pytest.mark.parametrize('cls,kwargs,field', [
    (RandomPhotometricDistort, dict(p=1.5), 'p'),
    (RandomPhotometricDistort, dict(brightness=(1.2, 0.8)), 'brightness'),
    (RandomPhotometricDistort, dict(hue=(-0.6, 0.1)), 'hue'),
    (RandomIoUCrop, dict(trials=0), 'trials'),
    (RandomIoUCrop, dict(sampler_options=[]), 'sampler_options'),
    (RandomIoUCrop, dict(p=True), 'p'),
])
def test_bad_arguments_named(cls, kwargs, field):
    with pytest.raises(ValueError, match=f'`{field}'):
        cls(**kwargs)
