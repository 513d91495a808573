"""PaddingAwareDINO on the DINO-ViT COCO configs (2-block backbones of 64
dims, DINO with 2 + 2 layers and 100 queries, so that the file runs in
seconds) with a padded batch: images smaller than the batch shape.

- loss and predict modes run, and the backbone's ``padding_mask`` (read by
  a forward hook, not assumed) is the mask of each image's ``img_shape``
  built here, in both modes;
- the backbone's features of an image alone equal its features in a batch
  with a larger image (float64);
- an image's predictions alone, padded to the batch shape, equal its
  predictions in that batch beside a larger image (float64).

Why an image alone *without* padding is compared at the backbone and not at
the predictions: from the pyramid on DINO sees the batch shape, in detrex
as in mmdet (the channel mapper's GroupNorm takes its statistics over the
padded map; the decoder encodes each query's box relative to the padded
batch, ``reference_points * valid_ratios``), so its predictions for an image
depend on the size of the batch it is padded to. What mmpe adds -- the
backbone's masked padding -- makes the ViT's part batch-independent, and
that is the part compared. ViTDet's own encoding (the rel-pos config)
resizes its absolute and relative tables to the padded grid, in detrex as
here, so it is not among the configs compared alone.
"""
import copy
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs

REPO = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))
#: encodings that do not depend on the padded grid (PEG: zero padding at
#: each image's border; iRPE, RoPE-Mixed: offsets / integer positions)
CONFIGS = [
    f'configs/dino-4scale_vit-b-{pe}_vitdet_12e_coco.py'
    for pe in ('peg', 'irpe', 'rope-mixed')
]
#: the small image is not a multiple of 16 px (its last token row / column
#: is partly padding, alone as in the batch); the large one sets the batch
SMALL, LARGE = (3, 200, 250), (3, 320, 384)
#: float64: the same valid tokens, images and weights; the padded keys get
#: exactly zero attention (masked before the softmax), so only the
#: summation order of matmuls over more (zero) terms and other batch sizes
#: differs, ~1e-16 per operation over a few thousand: 1e-9 leaves margin
#: and is far below any float32 difference (~1e-6)
F64_TOL = dict(atol=1e-9, rtol=1e-9)


def _model(name, dtype=torch.float32):
    cfg = Config.fromfile(osp.join(REPO, name))
    model_cfg = cfg.model
    model_cfg.backbone.init_cfg = None
    model_cfg.backbone.arch = dict(embed_dims=64, depth=2, num_heads=2,
                                   mlp_ratio=2.)
    model_cfg.backbone.global_blocks = (1, )
    model_cfg.neck.in_channels = 64
    model_cfg.num_queries = model_cfg.test_cfg.max_per_img = 100
    model_cfg.encoder.num_layers = model_cfg.decoder.num_layers = 2
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(model_cfg))
    model.init_weights()
    return model.to(dtype)


def _record_backbone(model):
    """Every backbone call's ``padding_mask`` and output map."""
    calls = []
    model.backbone.register_forward_hook(
        lambda m, args, kwargs, out: calls.append(
            (kwargs.get('padding_mask'), out[0].detach())),
        with_kwargs=True)
    return calls


def _expected_mask(data):
    """(B, H, W), True past each sample's ``img_shape``."""
    inputs = data['inputs']
    mask = torch.ones(inputs.shape[0], *inputs.shape[-2:], dtype=torch.bool)
    for i, sample in enumerate(data['data_samples']):
        h, w = sample.img_shape
        mask[i, :h, :w] = False
    return mask


def _batch():
    return demo_mm_inputs(2, [SMALL, LARGE], num_items=[2, 1],
                          num_classes=80, with_mask=False)


@pytest.mark.parametrize('name', CONFIGS)
def test_padded_batch_loss_and_predict_give_the_mask_to_the_backbone(name):
    model = _model(name)
    calls = _record_backbone(model)
    packed = _batch()

    data = model.data_preprocessor(packed, True)
    assert data['inputs'].shape[-2:] == LARGE[1:]
    losses = model(**data, mode='loss')
    total, log_vars = model.parse_losses(losses)
    assert torch.isfinite(total), log_vars
    total.backward()
    mask = _expected_mask(data)
    assert mask[0].any() and not mask[1].any()  # the small one is padded
    (seen, _), = calls
    assert seen is not None and torch.equal(seen, mask)

    model.eval()
    calls.clear()
    data = model.data_preprocessor(packed, False)
    with torch.no_grad():
        results = model(**data, mode='predict')
    (seen, _), = calls
    assert seen is not None and torch.equal(seen, _expected_mask(data))
    assert len(results) == 2
    for result in results:
        boxes = result.pred_instances.bboxes
        assert boxes.shape == (100, 4) and torch.isfinite(boxes).all()


def _predict(model, data):
    with torch.no_grad():
        return model(**data, mode='predict')


@pytest.mark.parametrize('name', CONFIGS)
def test_backbone_features_alone_equal_those_in_a_larger_batch(name):
    model = _model(name, torch.float64).eval()
    calls = _record_backbone(model)
    packed = _batch()
    batch = model.data_preprocessor(packed, False)
    batch['inputs'] = batch['inputs'].double()
    alone = model.data_preprocessor(
        dict(inputs=packed['inputs'][:1],
             data_samples=copy.deepcopy(packed['data_samples'][:1])), False)
    alone['inputs'] = alone['inputs'].double()
    assert alone['inputs'].shape[-2:] == SMALL[1:]  # no padding alone
    _predict(model, batch)
    _predict(model, alone)
    (_, in_batch), (_, by_itself) = calls
    h, w = by_itself.shape[-2:]
    assert (h, w) == (13, 16) and in_batch.shape[-2:] == (20, 24)
    torch.testing.assert_close(in_batch[:1, :, :h, :w], by_itself,
                               **F64_TOL)


@pytest.mark.parametrize('name', CONFIGS)
def test_predictions_alone_equal_those_beside_a_larger_image(name):
    """The small image padded to the batch shape, alone, against the same
    in the batch with the large image: the other image changes nothing."""
    model = _model(name, torch.float64).eval()
    packed = _batch()
    batch = model.data_preprocessor(packed, False)
    batch['inputs'] = batch['inputs'].double()
    alone = dict(inputs=batch['inputs'][:1].clone(),
                 data_samples=copy.deepcopy(batch['data_samples'][:1]))
    assert alone['data_samples'][0].batch_input_shape == LARGE[1:]
    beside = _predict(model, batch)[0].pred_instances
    single = _predict(model, alone)[0].pred_instances
    assert len(single.scores) == 100
    assert torch.equal(beside.labels, single.labels)
    torch.testing.assert_close(beside.scores, single.scores, **F64_TOL)
    torch.testing.assert_close(beside.bboxes, single.bboxes, **F64_TOL)
