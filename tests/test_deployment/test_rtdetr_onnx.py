"""RT-DETR's ONNX export (PyTorch's dynamo exporter; dynamic batch, height
and width): onnxruntime equals the detector's own tensor forward with data
samples (its padding read in Python from the samples) at the export size,
at another size and in a padded batch of mixed sizes, for the released
setting (sine in AIFI, ``grid_sample`` cross-attention) and for normalised
RoPE-Mixed with the discrete sampling and agnostic query selection.

Every other AIFI encoding (iRPE bias / contextual, RoPE-2D, RoPE-Mixed,
log-CPB, 2D ALiBi, LookHere, none) is exported once, all of them in one
graph beside each other (one export instead of ten: the exporter's time
grows with the ops, and the rest of RT-DETR's graph does not depend on the
encoding), AIFI's input and each image's valid size in, each encoding's
AIFI out, and onnxruntime compared with PyTorch at three sizes (two with
padded images).

A small RT-DETR (``tests/rtdetr_small.py``: PResNetVd-18 of 8 base
channels, a 32-channel hybrid encoder with one RepVGG block per CSP layer,
a 1-layer decoder).
"""
import contextlib

import pytest
import torch
from mmdet.registry import MODELS
from rtdetr_small import sample, small_rtdetr_cfg
from torch import nn
from torch.export import Dim

from mmpe.deployment import (SUPPORTED_NAMES, DETRExportWrapper,
                             RTDETRExportWrapper, export_detector_onnx,
                             export_onnx, export_wrapper, max_abs_diff,
                             onnxruntime_session,
                             padding_mask_from_img_shapes,
                             predict_from_outputs, run_onnxruntime)

# float32, random weights: onnxruntime's kernels sum in other orders than
# torch's (~1e-6 relative here); logits of magnitude ~1-10, boxes in
# [0, 1]. A wrong mask, grid or encoding moves outputs by >= 1e-2.
ATOL = 1e-4

#: the detector exports: (AIFI's encoder_pe, head settings)
DETECTORS = {
    'sine-grid-sample': (dict(absolute='sine'), dict()),
    'rope-mixed-normalized-discrete': (
        dict(absolute='none', relative=dict(type='rope-mixed',
                                            coords='normalized')),
        dict(cross_attn_method='discrete', query_select_method='agnostic')),
}
#: AIFI alone, every other encoding (the neck's test's list)
AIFI_ENCODINGS = {
    'none': dict(absolute='none'),
    'irpe-bias': dict(relative=dict(type='irpe', mode='bias', ratio=1.9,
                                    init='xavier', on='k')),
    'irpe-ctx': dict(absolute='none', relative=dict(
        type='irpe', mode='contextual', method='product', ratio=1.9,
        init='xavier', on='qkv')),
    'rope2d': dict(absolute='none', relative='rope2d'),
    'rope-mixed': dict(relative='rope-mixed'),
    'log-cpb': dict(relative=dict(type='log-cpb', pretrained_size=(4, 4),
                                  hidden=16)),
    'alibi-2d': dict(relative='alibi-2d'),
    'lookhere': dict(absolute='none', relative=dict(
        type='lookhere', directions='corners')),
}
#: (B, H, W) and each image's valid (h, w) (None: the whole input);
#: multiples of 32 as the preprocessor pads them
EXPORT = ((2, 96, 128), [(96, 128), (64, 96)])
CASES = {
    'export-size': EXPORT,
    'single-64x160': ((1, 64, 160), None),
    'padded-batch': ((3, 128, 96), [(128, 96), (96, 64), (64, 96)]),
}


@contextlib.contextmanager
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _images(batch, height, width, shapes, seed=0, channels=3):
    """Inputs, zero on padding as mmdet's preprocessor pads."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, channels, height, width, generator=gen)
    shapes = shapes or [(height, width)] * batch
    for i, (h, w) in enumerate(shapes):
        images[i, :, h:] = 0
        images[i, :, :, w:] = 0
    return images, torch.tensor(shapes, dtype=torch.long)


def _samples(img_shapes, batch_shape):
    return [sample(tuple(s), batch_shape) for s in img_shapes.tolist()]


def _model(encoder_pe, head):
    # one decoder layer: every op of the two, at half their export time
    cfg = small_rtdetr_cfg(num_layers=1, **head)
    # one RepVGG block per CSP layer (export time grows with the ops)
    cfg['neck'].update(encoder_pe=encoder_pe, num_heads=4, depth_mult=0.34)
    model = MODELS.build(cfg)
    model.init_weights()
    # box deltas off zero (the released init zeroes them: the boxes would
    # be the anchors whatever the graph computed)
    for p in model.parameters():
        if not p.any():
            p.data.normal_(std=0.3)
    return model.eval()


@pytest.fixture(scope='module', params=list(DETECTORS))
def exported(request, tmp_path_factory):
    """(detector, onnxruntime session), exported once per setting."""
    with _one_thread(), torch.random.fork_rng():
        torch.manual_seed(0)
        model = _model(*DETECTORS[request.param])
        out = str(tmp_path_factory.mktemp('onnx') / f'{request.param}.onnx')
        images, img_shapes = _images(*EXPORT[0], EXPORT[1])
        wrapper = export_detector_onnx(model, out, images, img_shapes,
                                       optimize=False)
    assert isinstance(wrapper, RTDETRExportWrapper)
    return model, onnxruntime_session(out, num_threads=1)


@pytest.mark.parametrize('case', list(CASES))
def test_onnxruntime_equals_the_detectors_tensor_forward(exported, case):
    model, session = exported
    (batch, height, width), shapes = CASES[case]
    images, img_shapes = _images(batch, height, width, shapes, seed=1)
    samples = _samples(img_shapes, (height, width))
    with torch.no_grad():
        all_scores, all_boxes = model(images, samples, mode='tensor')
        preds = model.predict(images, samples)
    want = (all_scores[-1], all_boxes[-1])
    got = run_onnxruntime(session, dict(images=images, img_shapes=img_shapes))
    assert got[0].shape == (batch, 20, 4) and got[1].shape == (batch, 20, 4)
    assert max_abs_diff(got, want) < ATOL
    # images -> detections: the graph's outputs through the head's
    # post-processing give the detector's predictions
    dets = predict_from_outputs(model, *got, [s.metainfo for s in samples])
    for det, pred in zip(dets, preds, strict=True):
        pred = pred.pred_instances
        assert torch.equal(det.labels, pred.labels)
        assert max_abs_diff([det.scores], [pred.scores]) < ATOL
        # pixels: boxes in [0, 1] times sizes <= 160
        assert max_abs_diff([det.bboxes], [pred.bboxes]) < 160 * ATOL
    if shapes is None:
        return
    # control: the same pixels told they fill the batch predict otherwise
    full = torch.tensor([[height, width]] * batch)
    other = run_onnxruntime(session, dict(images=images, img_shapes=full))
    assert max_abs_diff(other[1:], want[1:]) > 1e-2


class _AIFIs(nn.Module):
    """Each neck's AIFI on one projected stride-32 map ``(B, C, h, w)``,
    with the padding of each image's valid ``(h, w)`` pixels (as
    :class:`RTDETRExportWrapper` gives it to the neck)."""

    def __init__(self, necks):
        super().__init__()
        self.necks = nn.ModuleList(necks)

    def forward(self, feat, img_shapes):
        height, width = feat.shape[-2:]
        mask = padding_mask_from_img_shapes(img_shapes,
                                            (height * 32, width * 32))
        return tuple(neck.aifi(0, feat, mask) for neck in self.necks)


def test_every_aifi_encoding_in_onnxruntime(tmp_path):
    with _one_thread(), torch.random.fork_rng():
        torch.manual_seed(0)
        necks = [
            MODELS.build(dict(type='RTDETRHybridEncoder',
                              in_channels=[16, 32, 64], hidden_dim=32,
                              num_heads=4, dim_feedforward=64,
                              encoder_pe=pe)).eval()
            for pe in AIFI_ENCODINGS.values()
        ]
        module = _AIFIs(necks).eval()
        for name, p in module.named_parameters():
            if '.grid_bias.' in name:  # log-CPB's near-constant init
                p.data.normal_(std=0.5)
        batch = Dim('batch', min=1, max=1024)
        feat, img_shapes = _images(2, 3, 4, None, channels=32)
        img_shapes = torch.tensor([[96, 128], [64, 96]])
        out = str(tmp_path / 'aifi.onnx')
        export_onnx(module, (feat, img_shapes), out, ('feat', 'img_shapes'),
                    tuple(AIFI_ENCODINGS), {
                        'feat': {0: batch, 2: Dim.DYNAMIC, 3: Dim.DYNAMIC},
                        'img_shapes': {0: batch}
                    }, optimize=False)
    session = onnxruntime_session(out, num_threads=1)
    cases = [((2, 3, 4), [(96, 128), (64, 96)]),
             ((3, 4, 6), [(128, 192), (64, 192), (128, 96)]),
             ((1, 5, 2), None)]
    for (b, h, w), shapes in cases:
        feat, _ = _images(b, h, w, None, seed=h, channels=32)
        shapes = torch.tensor(shapes or [(h * 32, w * 32)] * b)
        with torch.no_grad():
            want = module(feat, shapes)
        got = run_onnxruntime(session, dict(feat=feat, img_shapes=shapes))
        for name, g, t in zip(AIFI_ENCODINGS, got, want):
            assert max_abs_diff([g], [t]) < ATOL, (name, (b, h, w))


def test_rtdetr_is_listed_and_gets_its_own_wrapper():
    assert 'RTDETR' in SUPPORTED_NAMES
    model = MODELS.build(small_rtdetr_cfg()).eval()
    assert isinstance(export_wrapper(model), RTDETRExportWrapper)
    with pytest.raises(ValueError, match='RTDETRExportWrapper'):
        DETRExportWrapper(model)
    with pytest.raises(ValueError, match='expected an RTDETR'):
        RTDETRExportWrapper(nn.Linear(2, 2))
