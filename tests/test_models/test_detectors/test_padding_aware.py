"""Padding-aware detectors: the backbone gets each batch's padding mask
through the call.

Through a real Mask R-CNN (and RetinaNet, DETR) the backbone features of
each image of a padded batch are its features alone; every backbone call
inside one forward gets the mask and none after it; checkpoints interchange
with the plain mmdet detector."""
import copy
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from mmdet.registry import HOOKS, MODELS
from mmdet.testing import demo_mm_inputs
from mmpe.models.detectors import PaddingAwareMaskRCNN
from mmpe.models.utils import padding_mask_from_shapes

REPO = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))
SMALL = dict(embed_dims=16, depth=2, num_heads=2, mlp_ratio=2.)
TINY_MASK_RCNN = 'configs/quickstart/mask-rcnn_cpvt-tiny_synthetic.py'
#: ViTDet's layout: 4 x 4 windows in block 0, block 1 global
TINY_VITDET = 'configs/quickstart/mask-rcnn_vit-tiny-peg_vitdet_synthetic.py'
#: ViTDet's layout with RoPE-Mixed on DINOv3's normalised coordinates (each
#: image's positions from its valid extent in the mask; rescale in training)
NORMALIZED_ROPE = dict(
    pos_encoding='rope-mixed',
    rope_cfg=dict(coords='normalized', normalize='separate', rescale=2.))
#: (config, plain mmdet type, padding-aware type, backbone arguments)
DETECTORS = [
    (TINY_MASK_RCNN, 'MaskRCNN', 'PaddingAwareMaskRCNN', {}),
    (TINY_VITDET, 'MaskRCNN', 'PaddingAwareMaskRCNN', {}),
    (TINY_VITDET, 'MaskRCNN', 'PaddingAwareMaskRCNN', NORMALIZED_ROPE),
    ('configs/retinanet_cpvt-s_fpn_1x_coco.py', 'RetinaNet',
     'PaddingAwareRetinaNet', {}),
    ('configs/detr_cpvt-s_150e_coco.py', 'DETR', 'PaddingAwareDETR', {}),
]
DETECTOR_IDS = [
    osp.basename(d[0]) + ('-rope-mixed-normalized' if d[3] else '')
    for d in DETECTORS
]
# padded batch and single image run the same ops on different token sets
ALONE_TOL = dict(atol=1e-5, rtol=1e-5)


def _cfg(config, type_=None, backbone=None):
    cfg = Config.fromfile(osp.join(REPO, config))
    init_default_scope('mmdet')
    cfg.model.backbone.update(backbone or {})
    cfg.model.backbone.arch = SMALL
    cfg.model.backbone.init_cfg = None
    if cfg.model.backbone.get('window_size'):
        cfg.model.backbone.global_blocks = (SMALL['depth'] - 1, )
    cfg.model.neck.in_channels = SMALL['embed_dims']
    if type_ is not None:
        cfg.model.type = type_
    return copy.deepcopy(cfg.model)


def _build(model_cfg, seed=0):
    torch.manual_seed(seed)
    return MODELS.build(copy.deepcopy(model_cfg)).eval()


def _num_classes(model_cfg):
    head = model_cfg.get('bbox_head') or model_cfg.roi_head.bbox_head
    return head.num_classes


def _record_backbone(detector):
    """Every backbone call's first output map and ``padding_mask``."""
    calls = []
    detector.backbone.register_forward_hook(
        lambda m, args, kwargs, out: calls.append(
            (out[0].detach(), kwargs.get('padding_mask'))),
        with_kwargs=True)
    return calls


def _run(detector, calls, data, mode='predict'):
    calls.clear()
    with torch.no_grad():
        batch = detector.data_preprocessor(copy.deepcopy(data))
        detector(**batch, mode=mode)
    return batch


@pytest.mark.parametrize('config,plain,aware,backbone', DETECTORS,
                         ids=DETECTOR_IDS)
def test_backbone_sees_each_images_own_border(config, plain, aware, backbone):
    """The padding-aware detector's backbone features of each image in a
    padded batch are its features alone (with normalised RoPE coordinates:
    the positions of its own extent); the plain detector with the same
    weights lets the padding leak in."""
    aware_cfg = _cfg(config, aware, backbone)
    detector = _build(aware_cfg)
    leaky_detector = _build(_cfg(config, plain, backbone))
    leaky_detector.load_state_dict(detector.state_dict(), strict=True)
    # padded to 96 x 96 (pad_size_divisor 32 or 1)
    shapes = [(64, 96), (96, 40)]
    data = demo_mm_inputs(
        batch_size=2, image_shapes=[(3, *s) for s in shapes],
        num_items=[1, 2], num_classes=_num_classes(aware_cfg),
        with_mask=plain == 'MaskRCNN')
    calls = _record_backbone(detector)
    leaky_calls = _record_backbone(leaky_detector)

    batch = _run(detector, calls, data)
    assert tuple(batch['inputs'].shape[-2:]) == (96, 96)
    assert len(calls) == 1
    masked, mask = calls[0]
    assert torch.equal(mask, padding_mask_from_shapes(shapes, (96, 96)))
    _run(leaky_detector, leaky_calls, data)
    leaky = leaky_calls[0][0]
    for i, (h, w) in enumerate(shapes):
        single = dict(inputs=[data['inputs'][i]],
                      data_samples=[data['data_samples'][i]])
        _run(detector, calls, single)
        alone = calls[0][0]
        ht, wt = -(-h // 16), -(-w // 16)  # tokens of 16 x 16 patches
        torch.testing.assert_close(masked[i:i + 1, :, :ht, :wt],
                                   alone[..., :ht, :wt], **ALONE_TOL)
        assert (masked[i, :, ht:] == 0).all()
        assert (masked[i, :, :, wt:] == 0).all()
    assert not torch.allclose(leaky[1, :, :6, :3], masked[1, :, :6, :3],
                              atol=1e-3)

    # training: the loss goes through the same mask
    detector.train()
    batch = detector.data_preprocessor(copy.deepcopy(data), training=True)
    calls.clear()
    losses = detector(**batch, mode='loss')
    assert all(torch.isfinite(v).all() for k, v in losses.items()
               if 'loss' in k and isinstance(v, torch.Tensor))
    assert (calls[0][0][1, :, :, 3:] == 0).all()  # image 1: 40 px = 3 tokens

    # a later call without samples: nothing of the calls above is left
    detector.eval()
    leaky_detector.eval()
    with torch.no_grad():
        feats = detector.extract_feat(batch['inputs'])
        leaky_feats = leaky_detector.extract_feat(batch['inputs'])
    assert calls[-1][1] is None
    for out, ref in zip(feats, leaky_feats):
        torch.testing.assert_close(out, ref, atol=0, rtol=0)


class TwoLooks(PaddingAwareMaskRCNN):
    """Looks at the batch once more before mmdet's own entry point (as a
    consistency or distillation term would): two backbone calls in one
    forward."""

    def loss(self, batch_inputs, batch_data_samples):
        self.extract_feat(batch_inputs)
        return super().loss(batch_inputs, batch_data_samples)

    def predict(self, batch_inputs, batch_data_samples, rescale=True):
        self.extract_feat(batch_inputs)
        return super().predict(batch_inputs, batch_data_samples, rescale)

    def _forward(self, batch_inputs, batch_data_samples=None):
        self.extract_feat(batch_inputs)
        return super()._forward(batch_inputs, batch_data_samples)


@pytest.mark.parametrize('mode', ['loss', 'predict', 'tensor'])
def test_two_backbone_calls_in_one_forward_both_get_the_mask(mode):
    model_cfg = _cfg(TINY_MASK_RCNN)
    model_cfg.pop('type')
    model_cfg.pop('_scope_', None)
    init_default_scope('mmdet')
    torch.manual_seed(0)
    detector = TwoLooks(**model_cfg)
    detector.train(mode == 'loss')
    calls = _record_backbone(detector)
    shapes = [(64, 96), (96, 40)]
    data = demo_mm_inputs(batch_size=2, image_shapes=[(3, *s) for s in shapes],
                          num_items=[1, 2], num_classes=4, with_mask=True)
    batch = detector.data_preprocessor(copy.deepcopy(data),
                                       training=mode == 'loss')
    want = padding_mask_from_shapes(shapes, (96, 96))
    bad = copy.deepcopy(batch['data_samples'])  # before predict adds preds
    bad[1].set_metainfo(dict(batch_input_shape=(32, 32)))

    with torch.set_grad_enabled(mode == 'loss'):
        detector(**batch, mode=mode)
    assert len(calls) == 2
    for _, mask in calls:
        assert torch.equal(mask, want)
    torch.testing.assert_close(calls[0][0], calls[1][0], atol=0, rtol=0)

    # later calls without samples get no mask: nothing outlived the forward
    calls.clear()
    detector.extract_feat(batch['inputs'])
    assert calls[0][1] is None
    # ... not even after a forward that raised half-way
    with pytest.raises(ValueError, match=r'batch of \(32, 32\)'):
        detector(batch['inputs'], bad, mode=mode)
    calls.clear()
    detector.extract_feat(batch['inputs'])
    assert calls[0][1] is None


@pytest.mark.parametrize('config,plain,aware,backbone', DETECTORS,
                         ids=DETECTOR_IDS)
def test_checkpoints_interchange_with_the_plain_detector(config, plain,
                                                         aware, backbone):
    detector = _build(_cfg(config, aware, backbone))
    mmdet_detector = _build(_cfg(config, plain, backbone), seed=1)
    assert type(mmdet_detector).__name__ == plain
    assert list(detector.state_dict()) == list(mmdet_detector.state_dict())
    mmdet_detector.load_state_dict(detector.state_dict(), strict=True)
    detector.load_state_dict(mmdet_detector.state_dict(), strict=True)
    # an unpadded batch: the mask is all False and nothing changes
    data = demo_mm_inputs(batch_size=1, image_shapes=[(3, 64, 96)],
                          num_items=[1], num_classes=4)
    outs = []
    for model in (detector, mmdet_detector):
        batch = model.data_preprocessor(copy.deepcopy(data))
        with torch.no_grad():
            outs.append(model(**batch, mode='tensor'))
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)


def test_backbone_without_masks_is_refused():
    init_default_scope('mmdet')
    cfg = dict(
        type='PaddingAwareRetinaNet',
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
            loss_bbox=dict(type='L1Loss')))
    with pytest.raises(ValueError, match='ResNet.*mask-aware backbones: CPVT'):
        MODELS.build(cfg)


def test_removed_hook_names_its_replacement():
    with pytest.raises(ValueError,
                       match="'MaskRCNN' -> 'PaddingAwareMaskRCNN'"):
        HOOKS.build(dict(type='BackbonePaddingMaskHook'))


def test_padmask_quickstart_config_is_the_padding_aware_detector():
    base = Config.fromfile(osp.join(REPO, TINY_MASK_RCNN))
    cfg = Config.fromfile(osp.join(
        REPO, 'configs/quickstart/mask-rcnn_cpvt-tiny_padmask_synthetic.py'))
    assert cfg.model.type == 'PaddingAwareMaskRCNN'
    # the switch needs no hook: none of the config's hooks is the removed
    # BackbonePaddingMaskHook, and they are the runtime base's, as the tiny
    # Mask R-CNN's
    hooks = [h['type'] for h in cfg.get('custom_hooks', [])]
    assert 'BackbonePaddingMaskHook' not in hooks
    assert cfg.get('custom_hooks') == base.get('custom_hooks')
    base.model.type = cfg.model.type
    assert cfg.model == base.model  # the switch is the only difference
