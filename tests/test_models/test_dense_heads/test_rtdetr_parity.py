"""mmpe's RT-DETR decoder side against the released RT-DETRv2's recorded
outputs (``tests/data/rtdetr_authors/decoder``, made by
``tools/analysis/rtdetr_decoder_fixtures.py`` from lyuwenyu/RT-DETR).

Each fixture names the released decoder's keys and shapes; the weights are
rebuilt here by the script's rule, mapped to mmpe's names by
:mod:`mmpe.models.utils.rtdetr_decoder_keys` and loaded strictly into a
``RTDETR`` whose ``forward_transformer`` gets the same encoder maps. Then:
the selected queries, the ``eval_idx`` layer and the detections in
inference; in training (seeded alike) the denoising groups, every layer's
outputs, the matching and each loss term. Controls: a wrong weight and a
swapped sampling method must differ.
"""
import os.path as osp

import numpy as np
import pytest
import torch
from mmdet.registry import MODELS

from mmpe.models.utils import convert_rtdetr_decoder
from rtdetr_decoder_fixtures import (BATCH, GT_COUNTS, HIDDEN, KEEP_CLASSES,
                                     NUM_CLASSES, SEED, SETTINGS,
                                     rule_features, rule_tensor)
from rtdetr_small import sample

FIXTURES = osp.join(osp.dirname(__file__), '..', '..', 'data',
                    'rtdetr_authors', 'decoder')
#: both run in float64 (the fixture script says why) and are stored as
#: float32: the stored values' rounding (6e-8 relative, logits up to ~30)
LOGIT_ATOL = 1e-5
BOX_ATOL = 1e-6
#: loss terms: float64 sums (the released ones in the same order)
LOSS_RTOL = 1e-9


def _load(name):
    path = osp.join(FIXTURES, f'{name}.npz')
    assert osp.isfile(path), f'{path} missing: run ' \
        'tools/analysis/rtdetr_decoder_fixtures.py'
    return dict(np.load(path))


def _model(setting, data, weights=None):
    head = dict(
        type='RTDETRHead', num_classes=NUM_CLASSES, embed_dims=HIDDEN,
        num_queries=300, in_channels=[HIDDEN] * 3, num_levels=3,
        num_points=[4, 4, 4], num_heads=8, num_layers=setting['num_layers'],
        ffn_dims=1024, num_denoising=100, eval_idx=setting['eval_idx'],
        cross_attn_method=setting['method'],
        query_select_method=setting['select'])
    model = MODELS.build(dict(
        type='RTDETR',
        backbone=dict(type='PResNetVd', depth=18, base_channels=8,
                      out_indices=(1, 2, 3)),
        neck=dict(type='RTDETRHybridEncoder', in_channels=[16, 32, 64],
                  hidden_dim=HIDDEN, dim_feedforward=64, expansion=0.25),
        bbox_head=head, test_cfg=dict(max_per_img=300)))
    if weights is None:
        weights = _authors_weights(data)
    missing, unexpected = model.bbox_head.load_state_dict(
        {k[len('bbox_head.'):]: v
         for k, v in convert_rtdetr_decoder(weights).items()}, strict=False)
    assert not unexpected, unexpected
    # what the released model has no key for: BN's batch counters only
    assert all(k.endswith('num_batches_tracked') for k in missing), missing
    return model.double()


def _authors_weights(data):
    return {
        str(k): rule_tensor(str(k), [int(s) for s in shape if s])
        for k, shape in zip(data['keys'], data['shapes'])
    }


def _samples(setting, data):
    h, w = setting['input']
    labels = torch.from_numpy(data['gt_labels'])
    boxes = torch.from_numpy(data['gt_boxes'])
    xyxy = torch.cat([boxes[:, :2] - boxes[:, 2:] / 2,
                      boxes[:, :2] + boxes[:, 2:] / 2], 1)
    xyxy = xyxy * torch.tensor([w, h, w, h], dtype=torch.float32)
    out, start = [], 0
    for n in GT_COUNTS:
        out.append(sample((h, w), (h, w), xyxy[start:start + n],
                          labels[start:start + n]))
        start += n
    return out


def _feats(setting, data):
    feats = rule_features(setting['input'])
    np.testing.assert_allclose([f.sum().item() for f in feats],
                               data['feat_sums'], rtol=1e-6)
    return tuple(f.double() for f in feats)


def _check_logits(got, data, key):
    np.testing.assert_allclose(
        got[..., :KEEP_CLASSES].numpy(), data[f'{key}_first'], rtol=0,
        atol=LOGIT_ATOL)
    np.testing.assert_allclose(
        got.amax(-1).numpy(), data[f'{key}_max'], rtol=0, atol=LOGIT_ATOL)


def _run(model, setting, data, train):
    """Training on both images, inference on the first (as recorded)."""
    samples, feats = _samples(setting, data), _feats(setting, data)
    if not train:
        samples, feats = samples[:1], tuple(f[:1] for f in feats)
    model.train(train)
    torch.manual_seed(SEED)
    with torch.set_grad_enabled(train):
        out = model.forward_transformer(feats, samples, setting['input'])
    return out, samples


@pytest.mark.parametrize('name', sorted(SETTINGS))
def test_inference_equals_the_released_decoder(name):
    setting, data = SETTINGS[name], _load(name)
    model = _model(setting, data)
    out, samples = _run(model, setting, data, train=False)
    _check_logits(out['enc_logits'], data, 'eval_enc_logits')
    np.testing.assert_allclose(out['enc_boxes'].numpy(),
                               data['eval_enc_boxes'], atol=BOX_ATOL, rtol=0)
    assert out['all_logits'].shape[0] == 1  # the eval_idx layer only
    _check_logits(out['all_logits'][0], data, 'eval_logits')
    np.testing.assert_allclose(out['all_boxes'][0].numpy(),
                               data['eval_boxes'], atol=BOX_ATOL, rtol=0)
    dets = model.bbox_head.predict(out['all_logits'], out['all_boxes'],
                                   samples, rescale=True)
    h, w = setting['input']
    # the released post-processor does not clip to the image; mmdet does
    want_boxes = data['eval_det_boxes'].copy()
    want_boxes[..., 0::2] = want_boxes[..., 0::2].clip(0, w)
    want_boxes[..., 1::2] = want_boxes[..., 1::2].clip(0, h)
    for i, det in enumerate(dets):
        np.testing.assert_array_equal(det.labels.numpy(),
                                      data['eval_det_labels'][i])
        np.testing.assert_allclose(det.scores.numpy(),
                                   data['eval_det_scores'][i], atol=1e-5)
        # pixels: BOX_ATOL of a 640 px side
        np.testing.assert_allclose(det.bboxes.numpy(), want_boxes[i],
                                   atol=BOX_ATOL * 640, rtol=0)


TRAIN = sorted(n for n, s in SETTINGS.items() if s['train'])


def _authors_loss_name(name, num_layers):
    """Released loss names -> mmpe's (mmdet DINO's)."""
    base, _, rest = name.partition('_aux_')
    if rest:
        return f'd{rest}.{base}'
    base, _, rest = name.partition('_dn_')
    if rest:
        i = int(rest)
        return f'dn_{base}' if i == num_layers - 1 else f'd{i}.dn_{base}'
    base, _, rest = name.partition('_enc_')
    if rest:
        return f'enc_{base}'
    return name


@pytest.mark.parametrize('name', TRAIN)
def test_training_equals_the_released_decoder_and_criterion(name):
    setting, data = SETTINGS[name], _load(name)
    model = _model(setting, data)
    out, samples = _run(model, setting, data, train=True)
    dn = out['dn']
    np.testing.assert_allclose(dn.boxes_unact.detach().numpy(),
                               data['train_dn_boxes_unact'], atol=1e-5)
    np.testing.assert_array_equal(dn.attn_mask.numpy(),
                                  data['train_dn_attn_mask'])
    np.testing.assert_array_equal(
        torch.cat(dn.positive_idx).numpy(), data['train_dn_positive_idx'])
    _check_logits(out['all_logits'].detach(), data, 'train_logits')
    np.testing.assert_allclose(out['all_boxes'].detach().numpy(),
                               data['train_boxes'], atol=BOX_ATOL, rtol=0)
    _check_logits(out['enc_logits'].detach(), data, 'train_enc_logits')
    np.testing.assert_allclose(out['enc_boxes'].detach().numpy(),
                               data['train_enc_boxes'], atol=BOX_ATOL,
                               rtol=0)

    head = model.bbox_head
    last = out['all_logits'][-1][:, dn.num_denoising:]
    last_boxes = out['all_boxes'][-1][:, dn.num_denoising:]
    labels = [s.gt_instances.labels for s in samples]
    gts = [head.normalised_gt(s) for s in samples]
    b, q, g = head.match(last, last_boxes, labels, gts)
    got = sorted(zip(b.tolist(), q.tolist(), g.tolist()))
    starts = np.cumsum((0, ) + GT_COUNTS)
    want = []
    for i in range(BATCH):
        rows = slice(starts[i], starts[i + 1])
        want += [(i, int(qq), int(gg)) for qq, gg in zip(
            data['train_match_query'][rows], data['train_match_gt'][rows])]
    assert got == sorted(want)

    losses = head.loss(**out, batch_data_samples=samples)
    want = {
        _authors_loss_name(str(k), setting['num_layers']): v
        for k, v in zip(data['loss_names'], data['loss_values'])
    }
    assert sorted(losses) == sorted(want)
    for key, value in want.items():
        np.testing.assert_allclose(losses[key].item(), value,
                                   rtol=LOSS_RTOL, err_msg=key)


def test_controls_differ():
    name = 'r18_default_640'
    setting, data = SETTINGS[name], _load(name)
    weights = _authors_weights(data)
    key = 'decoder.decoder.layers.1.cross_attn.value_proj.weight'
    weights[key] = weights[key] * 1.01
    model = _model(setting, data, weights)
    out, _ = _run(model, setting, data, train=False)
    got = out['all_boxes'][0].numpy()
    assert np.abs(got - data['eval_boxes']).max() > 100 * BOX_ATOL
    # the sampling method shows at these tolerances (same weights)
    other = _load('r18_discrete_640')['eval_boxes']
    assert np.abs(other - data['eval_boxes']).max() > 100 * BOX_ATOL
