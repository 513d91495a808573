"""RT-DETR as a detector, as mmdet tests its detectors (loss / predict /
tensor modes) on a small R18-like model (PResNetVd-18 of 8 base channels,
mmpe's hybrid encoder and a 2-layer decoder of 32 channels):

- every mode runs; losses are finite and named as mmdet's DINO names them
  (also under bfloat16 autocast);
- one backward reaches every trainable parameter;
- predictions at a non-square size lie in the image;
- in a padded batch of mixed sizes the neck gets each image's mask, and an
  image padded alone to the batch's shape gives (float64) what it gives
  inside the batch; a control without the padding information differs.
"""
import copy

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs

from rtdetr_small import random_boxes, sample, small_rtdetr_cfg

#: float64: the same pixels, weights and valid cells; only batch-size
#: dependent summation orders differ (~1e-16 per operation)
F64_TOL = dict(atol=1e-9, rtol=1e-9)


def _model(**head):
    torch.manual_seed(0)
    model = MODELS.build(small_rtdetr_cfg(**head))
    model.init_weights()
    return model


def _data(model, shapes, training):
    packed = demo_mm_inputs(len(shapes), shapes, num_items=[3] * len(shapes),
                            num_classes=4)
    return model.data_preprocessor(packed, training)


@pytest.mark.parametrize('head', [
    dict(),
    dict(cross_attn_method='discrete', query_select_method='agnostic',
         eval_idx=0, num_levels=4, num_points=[3, 2, 2, 1],
         learn_query_content=True),
    dict(num_denoising=0),
])
def test_loss_predict_tensor_modes(head):
    model = _model(**head)
    model.train()
    data = _data(model, [(3, 128, 160), (3, 96, 128)], True)
    losses = model(**data, mode='loss')
    layers = model.bbox_head.decoder.num_layers
    dn = model.bbox_head.num_denoising > 0
    for kind in ('loss_vfl', 'loss_bbox', 'loss_giou'):
        assert kind in losses and f'enc_{kind}' in losses
        assert (f'dn_{kind}' in losses) == dn
        for i in range(layers - 1):
            assert f'd{i}.{kind}' in losses
            assert (f'd{i}.dn_{kind}' in losses) == dn
    assert all(torch.isfinite(v) for v in losses.values())

    model.eval()
    data = _data(model, [(3, 128, 160), (3, 96, 128)], False)
    with torch.no_grad():
        preds = model(**data, mode='predict')
        logits, boxes = model(**data, mode='tensor')
    assert len(preds) == 2 and len(preds[0].pred_instances) == 20
    assert logits.shape == (1, 2, 20, 4) and boxes.shape == (1, 2, 20, 4)


def test_gradients_reach_every_trainable_parameter():
    model = _model()
    # the released init zeroes the box heads' last layers (so no gradient
    # reaches the layers before them at step 0): connectivity is the point
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0, 0.02)
    model.train()
    data = _data(model, [(3, 96, 128), (3, 64, 96)], True)
    losses = model(**data, mode='loss')
    sum(losses.values()).backward()
    dead = [n for n, p in model.named_parameters()
            if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not dead, dead


def test_predictions_at_a_non_square_size_lie_in_the_image():
    model = _model().eval()
    gen = torch.Generator().manual_seed(0)
    inputs = torch.rand(1, 3, 96, 192, generator=gen)
    samples = [sample((90, 180), (96, 192), scale_factor=(0.5, 0.5))]
    with torch.no_grad():
        pred = model.predict(inputs, samples)[0].pred_instances
    assert pred.bboxes.shape == (20, 4)
    # rescaled to the original image: (180, 360)
    assert (pred.bboxes >= 0).all()
    assert (pred.bboxes[:, 0::2] <= 360).all()
    assert (pred.bboxes[:, 1::2] <= 180).all()
    assert ((pred.scores >= 0) & (pred.scores <= 1)).all()


def _padded(images, batch_shape):
    out = torch.zeros(len(images), 3, *batch_shape, dtype=torch.float64)
    for i, img in enumerate(images):
        out[i, :, :img.shape[1], :img.shape[2]] = img
    return out


def test_an_image_gives_alone_what_it_gives_in_a_padded_batch():
    model = _model().double().eval()
    gen = torch.Generator().manual_seed(1)
    big = torch.rand(3, 96, 160, generator=gen, dtype=torch.float64)
    small = torch.rand(3, 64, 96, generator=gen, dtype=torch.float64)
    shape = (96, 160)
    masks = []
    model.neck.register_forward_hook(
        lambda m, args, kwargs, out: masks.append(kwargs['padding_mask']),
        with_kwargs=True)
    batch = [sample((96, 160), shape), sample((64, 96), shape)]
    with torch.no_grad():
        both = model.predict(_padded([big, small], shape), batch)
        alone = model.predict(_padded([small], shape),
                              [sample((64, 96), shape)])
        plain = model.predict(_padded([small], shape),
                              [sample(shape, shape)])
    want = torch.ones(96, 160, dtype=torch.bool)
    want[:64, :96] = False
    assert not masks[0][0].any() and torch.equal(masks[0][1], want)
    assert masks[2] is None  # no image padded: no mask
    got, ref = both[1].pred_instances, alone[0].pred_instances
    torch.testing.assert_close(got.scores, ref.scores, **F64_TOL)
    torch.testing.assert_close(got.bboxes, ref.bboxes, **F64_TOL)
    assert torch.equal(got.labels, ref.labels)
    # control: the same pixels told they fill the batch predict otherwise
    other = plain[0].pred_instances
    assert not torch.allclose(other.bboxes, ref.bboxes, atol=1e-3)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match='query_select_method'):
        _model(query_select_method='one2many')
    model = _model(num_queries=100).eval()
    with pytest.raises(ValueError, match='fewer than `num_queries` 100'):
        model.predict(torch.rand(1, 3, 64, 64), [sample((64, 64), (64, 64))])
    cfg = small_rtdetr_cfg()
    cfg['neck'] = dict(type='ChannelMapper', in_channels=[16, 32, 64],
                       out_channels=32, kernel_size=1, num_outs=3)
    with pytest.raises(ValueError, match='padding_mask'):
        MODELS.build(copy.deepcopy(cfg))


def test_loss_under_bfloat16_autocast():
    # the matching (scipy) and the losses take the outputs in float32
    model = _model()
    model.train()
    data = _data(model, [(3, 96, 128), (3, 64, 96)], True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        losses = model(**data, mode='loss')
    assert all(v.dtype == torch.float32 and torch.isfinite(v)
               for v in losses.values())
    sum(losses.values()).backward()


@pytest.mark.parametrize('items', [[0, 0], [0, 2]])
def test_images_without_boxes(items):
    # no box in the batch: one dummy denoising query, zero box losses
    model = _model()
    model.train()
    packed = demo_mm_inputs(2, [(3, 96, 128), (3, 64, 96)], num_items=items,
                            num_classes=4)
    losses = model(**model.data_preprocessor(packed, True), mode='loss')
    assert all(torch.isfinite(v) for v in losses.values())
    assert (losses['loss_bbox'] == 0) == (sum(items) == 0)
    sum(losses.values()).backward()



def test_queries_are_selected_among_each_images_cells():
    """Padded cells (memory zeroed, anchors invalid) are ranked last; made
    the best-scored ones here: the encoder's projection bias ``b`` and a
    score along the centred ``b`` make a zeroed cell (``LN(b)``) the most
    aligned. The released init has zero box deltas, so the selected boxes
    are anchors (a padded cell's: +inf, sigmoid 1)."""
    model = _model().eval()
    head = model.bbox_head
    with torch.no_grad():
        bias = torch.randn(32)
        head.enc_output.proj.bias.copy_(bias)
        head.enc_output.proj.weight.mul_(0.1)
        direction = (bias - bias.mean()) / (bias - bias.mean()).norm()
        head.enc_score_head.weight.copy_(10 * direction.expand(4, -1))
        head.enc_score_head.bias.zero_()
    shape = (96, 160)
    feats = tuple(torch.randn(2, 32, 96 // s, 160 // s) for s in (8, 16, 32))
    samples = [sample(shape, shape), sample((64, 96), shape)]
    with torch.no_grad():
        out = model.forward_transformer(feats, samples, shape)
        assert (out['enc_boxes'][1, :, :2] < 1).all()
        # control: without the cells' mask the padded ones win
        enc_in, _ = model.pre_transformer(feats, samples, shape)
        boxes = head.select_queries(enc_in['feat'], enc_in['spatial_shapes'],
                                    enc_in['valid_ratios'])[3]
        assert (boxes[1, :, :2] == 1).any()


def test_valid_cells_are_those_starting_inside_the_image():
    from mmpe.models.detectors.rtdetr import valid_cells

    # 96 x 100 px images in a 160 x 160 batch: stride 8 -> 20 x 20 cells
    H = W = 160
    ratios = torch.tensor([[100 / W, 96 / H], [1.0, 1.0]])
    got = valid_cells(ratios, [(20, 20)]).reshape(2, 20, 20)
    for i in range(20):
        for j in range(20):  # a slow loop over the cells' first pixels
            assert got[0, i, j] == (i * 8 < 96 and j * 8 < 100)
    assert got[1].all()
