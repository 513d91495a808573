"""RTDETRBatchResize against the RT-DETR authors' collate rule, written here.

``BatchImageCollateFunction`` (lyuwenyu/RT-DETR,
``rtdetrv2_pytorch/src/data/dataloader.py``): ``sz = random.choice(scales)``
once per batch, ``F.interpolate(images, size=sz)`` (nearest), boxes
normalised by the image size and so unchanged; here the pixel boxes and the
shapes must follow the images.
"""
import random

import pytest
import torch
from mmdet.models.data_preprocessors import DetDataPreprocessor
from mmdet.structures import DetDataSample
from mmdet.structures.bbox import HorizontalBoxes
from mmengine.structures import InstanceData

from mmpe.datasets import RTDETR_SCALES, RTDETRBatchResize


def _nearest(images, h, w):
    """PyTorch's nearest rule, a loop: out[i, j] = in[floor(i * H / h),
    floor(j * W / w)]."""
    height, width = images.shape[-2:]
    out = images.new_zeros(images.shape[:-2] + (h, w))
    for i in range(h):
        for j in range(w):
            out[..., i, j] = images[..., int(i * height / h),
                                    int(j * width / w)]
    return out


def _samples(n, size, boxed=True):
    samples = []
    for k in range(n):
        sample = DetDataSample(
            metainfo=dict(img_shape=size, pad_shape=size,
                          batch_input_shape=size))
        boxes = torch.tensor([[1.0 + k, 2.0, 10.0, 12.0 + k]])
        sample.gt_instances = InstanceData(
            bboxes=HorizontalBoxes(boxes) if boxed else boxes,
            labels=torch.tensor([k]))
        samples.append(sample)
    return samples


def test_the_authors_scales():
    assert RTDETR_SCALES == (480, 512, 544, 576, 608, 640, 640, 640, 672,
                             704, 736, 768, 800)


@pytest.mark.parametrize('boxed', [True, False])
def test_one_size_per_batch_as_random_choice(boxed):
    torch.manual_seed(0)
    resize = RTDETRBatchResize(scales=[8, 12, (6, 10)])
    random.seed(3)
    expected = [random.choice([(8, 8), (12, 12), (6, 10)]) for _ in range(6)]
    random.seed(3)
    for size in expected:
        images = torch.rand(2, 3, 16, 16)
        samples = _samples(2, (16, 16), boxed)
        out, samples = resize(images, samples)
        h, w = size
        if (h, w) != (16, 16):
            torch.testing.assert_close(out, _nearest(images, h, w),
                                       atol=0, rtol=0)
        for k, sample in enumerate(samples):
            # the authors' normalised box, back in pixels of the new size
            norm = torch.tensor([[1.0 + k, 2.0, 10.0, 12.0 + k]]) / \
                torch.tensor([16., 16., 16., 16.])
            bboxes = sample.gt_instances.bboxes
            bboxes = bboxes.tensor if boxed else bboxes
            torch.testing.assert_close(
                bboxes, norm * torch.tensor([w, h, w, h]), atol=1e-5, rtol=0)
            assert sample.img_shape == (h, w)
            assert sample.pad_shape == (h, w)
            assert sample.batch_input_shape == (h, w)


def test_padded_image_shapes_scale_with_the_batch():
    resize = RTDETRBatchResize(scales=[32])
    samples = _samples(1, (16, 16))
    samples[0].set_metainfo(dict(img_shape=(10, 14)))
    _, samples = resize(torch.rand(1, 3, 16, 16), samples)
    assert samples[0].img_shape == (20, 28)


def test_disabled_and_control():
    resize = RTDETRBatchResize(scales=[8])
    images = torch.rand(1, 3, 16, 16)
    resize.enabled = False
    out, _ = resize(images, _samples(1, (16, 16)))
    assert out is images
    resize.enabled = True
    out, _ = resize(images, _samples(1, (16, 16)))
    # control: bilinear is not the authors' nearest
    bilinear = torch.nn.functional.interpolate(
        images, size=(8, 8), mode='bilinear', align_corners=False)
    assert not torch.allclose(out, bilinear)


def test_in_mmdet_data_preprocessor_training_only():
    pre = DetDataPreprocessor(
        mean=[0, 0, 0], std=[255, 255, 255], bgr_to_rgb=True,
        pad_size_divisor=32,
        batch_augments=[dict(type='RTDETRBatchResize', scales=[96])])
    data = dict(
        inputs=[torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8)] * 2,
        data_samples=_samples(2, (64, 64)))
    assert pre(data, training=True)['inputs'].shape[-2:] == (96, 96)
    data['data_samples'] = _samples(2, (64, 64))
    assert pre(data, training=False)['inputs'].shape[-2:] == (64, 64)


@pytest.mark.parametrize('kwargs,field', [
    (dict(scales=[]), 'scales'),
    (dict(scales=[0]), 'scales'),
    (dict(scales=[True]), 'scales'),
    (dict(scales=[(1, 2, 3)]), 'scales'),
    (dict(scales=640), 'scales'),
    (dict(mode='bicubic'), 'mode'),
])
def test_bad_arguments_named(kwargs, field):
    with pytest.raises(ValueError, match=f'`{field}`'):
        RTDETRBatchResize(**kwargs)
