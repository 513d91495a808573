"""Padding masks for mask-aware backbones inside unmodified mmdet detectors:
the mask builder against a loop, CPVT.set_valid_shapes against an explicit
mask, and a real detector whose backbone then gives each image of a padded
batch its single-image features."""
import copy
import os.path as osp
from types import SimpleNamespace

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from mmdet.registry import HOOKS, MODELS
from mmdet.testing import demo_mm_inputs
from mmpe.models.backbones import CPVT
from mmpe.models.utils import attach_padding_mask, padding_mask_from_shapes

REPO = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))
SMALL = dict(embed_dims=16, depth=2, num_heads=2, mlp_ratio=2.)


def test_padding_mask_from_shapes_matches_loop():
    shapes = [(5, 7), (9, 2), (9, 11)]
    mask = padding_mask_from_shapes(shapes, (9, 11))
    for i, (h, w) in enumerate(shapes):
        for y in range(9):
            for x in range(11):
                assert bool(mask[i, y, x]) == (y >= h or x >= w)


@pytest.mark.parametrize('shape', [(10, 3), (3, 12), (0, 3)])
def test_padding_mask_from_shapes_rejects_what_does_not_fit(shape):
    with pytest.raises(ValueError, match=rf'\({shape[0]}, {shape[1]}\)'):
        padding_mask_from_shapes([shape], (9, 11))


def test_set_valid_shapes_equals_explicit_mask_and_is_used_once():
    torch.manual_seed(0)
    model = CPVT(arch=SMALL, out_indices=(0, 1)).eval()
    x = torch.randn(2, 3, 48, 64)
    shapes = [(48, 30), (20, 64)]
    mask = padding_mask_from_shapes(shapes, (48, 64))
    expected = model(x, padding_mask=mask)
    plain = model(x)
    model.set_valid_shapes(shapes)
    for out, ref in zip(model(x), expected):
        torch.testing.assert_close(out, ref, atol=0, rtol=0)
    assert not torch.allclose(expected[1], plain[1])
    for out, ref in zip(model(x), plain):  # forgotten after one forward
        torch.testing.assert_close(out, ref, atol=0, rtol=0)
    model.set_valid_shapes([(48, 64)])
    with pytest.raises(ValueError, match='1 shapes for a batch of 2'):
        model(x)


def _tiny_mask_rcnn():
    cfg = Config.fromfile(
        osp.join(REPO, 'configs/quickstart/mask-rcnn_cpvt-tiny_synthetic.py'))
    init_default_scope('mmdet')
    cfg.model.backbone.arch = SMALL
    cfg.model.neck.in_channels = SMALL['embed_dims']
    torch.manual_seed(0)
    return MODELS.build(copy.deepcopy(cfg.model)).eval()


def test_detector_backbone_sees_each_images_own_border():
    """Through an unmodified Mask R-CNN: with the mask attached, the
    backbone features of each image in a padded batch are its features
    alone; without it, the padding leaks in."""
    detector = _tiny_mask_rcnn()
    shapes = [(64, 96), (96, 40)]  # padded to 96 x 96 by the preprocessor
    data = demo_mm_inputs(batch_size=2, image_shapes=[(3, *s) for s in shapes],
                          num_items=[1, 2], num_classes=4, with_mask=True)
    seen = []
    detector.backbone.register_forward_hook(
        lambda m, args, out: seen.append(out[0].detach()))

    def run(data_batch):
        seen.clear()
        with torch.no_grad():
            batch = detector.data_preprocessor(copy.deepcopy(data_batch))
            detector(**batch, mode='predict')
        return seen[0], batch['inputs'].shape[-2:]

    leaky, batch_shape = run(data)
    assert tuple(batch_shape) == (96, 96)
    handle = attach_padding_mask(detector)
    masked, _ = run(data)
    for i, (h, w) in enumerate(shapes):
        single = dict(inputs=[data['inputs'][i]],
                      data_samples=[data['data_samples'][i]])
        alone, _ = run(single)
        ht, wt = -(-h // 16), -(-w // 16)
        torch.testing.assert_close(
            masked[i:i + 1, :, :ht, :wt], alone[..., :ht, :wt],
            atol=1e-5, rtol=1e-5)
        assert (masked[i, :, ht:] == 0).all() and (masked[i, :, :, wt:] == 0
                                                   ).all()
    assert not torch.allclose(leaky[1, :, :6, :3], masked[1, :, :6, :3],
                              atol=1e-3)
    # training goes through the same pre-hook
    detector.train()
    batch = detector.data_preprocessor(copy.deepcopy(data), training=True)
    seen.clear()
    losses = detector(**batch, mode='loss')
    assert all(torch.isfinite(v).all() for k, v in losses.items()
               if 'loss' in k and isinstance(v, torch.Tensor))
    assert (seen[0][1, :, :, 3:] == 0).all()  # image 1 is 40 px = 3 tokens
    handle.remove()
    detector.eval()
    again, _ = run(data)
    torch.testing.assert_close(again, leaky, atol=0, rtol=0)


def test_hook_attaches_for_the_run_and_detaches_after():
    detector = _tiny_mask_rcnn()
    hook = HOOKS.build(dict(type='BackbonePaddingMaskHook'))
    runner = SimpleNamespace(model=detector)
    hook.before_run(runner)
    assert len(detector._forward_pre_hooks) == 1
    hook.after_run(runner)
    assert len(detector._forward_pre_hooks) == 0


def test_backbone_without_masks_is_refused():
    init_default_scope('mmdet')
    detector = MODELS.build(dict(
        type='RetinaNet',
        data_preprocessor=dict(type='DetDataPreprocessor'),
        backbone=dict(type='ResNet', depth=18, init_cfg=None),
        neck=dict(type='FPN', in_channels=[64, 128, 256, 512],
                  out_channels=16, num_outs=5),
        bbox_head=dict(
            type='RetinaHead', num_classes=4, in_channels=16,
            feat_channels=16,
            anchor_generator=dict(type='AnchorGenerator', octave_base_scale=4,
                                  scales_per_octave=3, ratios=[1.0],
                                  strides=[8, 16, 32, 64, 128]),
            bbox_coder=dict(type='DeltaXYWHBBoxCoder'),
            loss_cls=dict(type='FocalLoss', use_sigmoid=True),
            loss_bbox=dict(type='L1Loss'))))
    with pytest.raises(TypeError, match='ResNet.*mask-aware backbones: CPVT'):
        attach_padding_mask(detector)
