"""The whole RT-DETR against the released one: images -> the output
layer's logits and boxes -> detections.

Fixtures: ``tests/data/rtdetr_authors/model`` (made by
``tools/analysis/rtdetr_model_fixtures.py`` from lyuwenyu/RT-DETR's
``RTDETR`` with ``PResNet``, ``HybridEncoder``, ``RTDETRTransformerv2`` and
``RTDETRPostProcessor``; R18vd and R50vd, 640 x 640 and 480 x 640; eval
mode, float64). mmpe's ``RTDETR`` is built with the released settings and
loaded, strictly, with the same weights (each part's rule under the
released names) through the key mappings
(``convert_presnet``, ``convert_hybrid_encoder``, ``convert_rtdetr_decoder``),
so the fixtures also prove the mappings end to end. A control loads one
weight wrong and must differ.
"""
import os.path as osp

import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from rtdetr_decoder_fixtures import KEEP_CLASSES
from rtdetr_decoder_fixtures import rule_tensor as decoder_rule
from rtdetr_model_fixtures import DECODERS, NUM_CLASSES, SETTINGS
from rtdetr_parity import BACKBONES
from rtdetr_small import sample
from rtdetr_weight_rule import rule_image, rule_tensor

from mmpe.models.utils import convert_rtdetr_decoder
from mmpe.models.utils.rtdetr_encoder_keys import (convert_hybrid_encoder,
                                                   convert_presnet)

FIXTURES = osp.join(osp.dirname(__file__), '..', '..', 'data',
                    'rtdetr_authors', 'model')
#: both float64, stored as float32: the stored values' rounding (6e-8
#: relative; logits up to ~30, boxes in [0, 1])
LOGIT_ATOL = 1e-5
BOX_ATOL = 1e-6
#: (the encoder's setting of the released configs)
NECKS = {
    'r18': dict(in_channels=[128, 256, 512], expansion=0.5),
    'r50': dict(in_channels=[512, 1024, 2048], expansion=1.0),
}


def _load(name):
    path = osp.join(FIXTURES, f'{name}.npz')
    assert osp.isfile(path), \
        f'{path} missing: run tools/analysis/rtdetr_model_fixtures.py'
    return dict(np.load(path))


def _state(data, part, rule):
    keys, shapes = data[f'{part}_keys'], data[f'{part}_shapes']
    return {str(k): rule(str(k), [int(s) for s in shape if s])
            for k, shape in zip(keys, shapes)}


def _model(name, data):
    part, size, _ = SETTINGS[name]
    # the released sin-cos shuffles non-square grids (the neck's docstring)
    layout = 'grid' if size[0] == size[1] else 'released'
    model = MODELS.build(dict(
        type='RTDETR',
        backbone=dict(type='PResNetVd', out_indices=(1, 2, 3),
                      style='pytorch', **BACKBONES[part]),
        neck=dict(type='RTDETRHybridEncoder', hidden_dim=256,
                  sine_layout=layout, **NECKS[part]),
        bbox_head=dict(
            type='RTDETRHead', num_classes=NUM_CLASSES, embed_dims=256,
            num_queries=300, in_channels=[256] * 3, num_levels=3,
            num_points=[4, 4, 4], num_heads=8, ffn_dims=1024,
            num_denoising=100, eval_idx=-1, **DECODERS[part]),
        test_cfg=dict(max_per_img=300)))
    state = {}
    for key, value in convert_presnet(
            _state(data, 'backbone', rule_tensor)).items():
        state['backbone.' + key] = value
    for key, value in convert_hybrid_encoder(
            _state(data, 'encoder', rule_tensor)).items():
        state['neck.' + key] = value
    state.update(convert_rtdetr_decoder(
        _state(data, 'decoder', decoder_rule)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    # what the released model has no key for: the head's BN batch counters
    assert all(k.endswith('num_batches_tracked') for k in missing), missing
    return model.double().eval()


def _run(model, name, data):
    _, (h, w), _ = SETTINGS[name]
    image = torch.from_numpy(data['image'])
    inputs = rule_image(image, (h, w)).double()
    samples = [sample((h, w), (h, w))]
    with torch.no_grad():
        logits, boxes = model(inputs, samples, mode='tensor')
        dets = model.predict(inputs, samples)[0].pred_instances
    return logits[-1, 0], boxes[-1, 0], dets


@pytest.mark.parametrize('name', list(SETTINGS))
def test_images_to_detections_equal_the_released_model(name):
    data = _load(name)
    logits, boxes, dets = _run(_model(name, data), name, data)
    np.testing.assert_allclose(logits[:, :KEEP_CLASSES].numpy(),
                               data['logits_first'][0], atol=LOGIT_ATOL,
                               rtol=0)
    np.testing.assert_allclose(logits.amax(-1).numpy(), data['logits_max'][0],
                               atol=LOGIT_ATOL, rtol=0)
    np.testing.assert_allclose(boxes.numpy(), data['boxes'][0],
                               atol=BOX_ATOL, rtol=0)
    _, (h, w), _ = SETTINGS[name]
    # the released post-processor does not clip to the image; mmdet does
    want = data['det_boxes'].copy()
    want[:, 0::2] = want[:, 0::2].clip(0, w)
    want[:, 1::2] = want[:, 1::2].clip(0, h)
    np.testing.assert_array_equal(dets.labels.numpy(), data['det_labels'])
    np.testing.assert_allclose(dets.scores.numpy(), data['det_scores'],
                               atol=1e-5)
    # pixels: BOX_ATOL of a 640 px side
    np.testing.assert_allclose(dets.bboxes.numpy(), want,
                               atol=BOX_ATOL * 640, rtol=0)


def test_control_a_wrong_weight_differs():
    name = 'r18_480x640'
    data = _load(name)
    model = _model(name, data)
    with torch.no_grad():  # AIFI's first FFN layer's rows rolled
        weight = model.neck.encoder[0].layers[0].ffn.layers[0][0].weight
        weight.copy_(weight.roll(1, 0))
    _, boxes, _ = _run(model, name, data)
    assert np.abs(boxes.numpy() - data['boxes'][0]).max() > 1e-3
