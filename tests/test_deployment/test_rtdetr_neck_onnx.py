"""ONNX export of RT-DETR's hybrid encoder with every AIFI encoding
(dynamic batch / height / width, padded batches): onnxruntime equals
PyTorch.

One graph holds a small neck per encoding behind one stand-in backbone
(one export for all: the exporter's cost grows with the graph's ops): the
sine's with its three levels (the fusion's convs and resizes), the others
AIFI's level alone; images and each image's valid size are the inputs, the
padding mask is made in the graph. The PyTorch reference is each neck's
eager forward with the mask of
:func:`mmpe.models.utils.padding_mask_from_shapes`.
"""
import contextlib

import pytest
import torch
import torch.nn as nn

from mmpe.deployment import (export_onnx, max_abs_diff, onnxruntime_session,
                             padding_mask_from_img_shapes, run_onnxruntime)
from mmpe.models.necks import RTDETRHybridEncoder
from mmpe.models.utils.padding_mask import padding_mask_from_shapes

#: every AIFI encoding, with the sine's released layout too (no absolute
#: part: the necks of the relative encodings with absolute='none')
ENCODINGS = {
    'sine': dict(absolute='sine'),
    'sine-released': dict(absolute='sine'),
    'irpe-bias': dict(relative=dict(type='irpe', mode='bias', init='xavier')),
    'irpe-ctx': dict(absolute='none', relative=dict(
        type='irpe', mode='contextual', init='xavier', on='qkv')),
    'rope2d': dict(absolute='none', relative='rope2d'),
    'rope-mixed-norm': dict(relative=dict(type='rope-mixed',
                                          coords='normalized')),
    'log-cpb': dict(relative=dict(type='log-cpb', pretrained_size=(4, 4),
                                  hidden=16)),
    'alibi-2d': dict(relative='alibi-2d'),
    'lookhere': dict(absolute='none', relative=dict(type='lookhere',
                                                    directions='corners')),
}
# float32: onnxruntime's GEMMs, softmax and norms sum in other orders than
# torch's, ~1e-6 of the outputs' largest value; a wrong mask or grid moves
# them by > 1e-2 of it
RTOL = 1e-4
EXPORT = ((2, 128, 160), [(128, 160), (96, 128)])
CASES = {
    'export-size': EXPORT,
    'single-96x224': ((1, 96, 224), None),
    'padded-batch': ((3, 160, 128), [(160, 128), (64, 128), (160, 96)]),
}


class _AllEncodings(nn.Module):
    """A strided-conv stand-in backbone, then one neck per encoding; each
    neck's levels flattened and concatenated into one output."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv2d(3, c, s, stride=s) for c, s in ((8, 8), (16, 16),
                                                      (32, 32)))
        self.necks = nn.ModuleList()
        for name, encoder_pe in ENCODINGS.items():
            levels = 3 if name == 'sine' else 1
            self.necks.append(RTDETRHybridEncoder(
                in_channels=[8, 16, 32][-levels:],
                feat_strides=[8, 16, 32][-levels:], hidden_dim=32,
                use_encoder_idx=[levels - 1], num_heads=4,
                dim_feedforward=64, expansion=0.5, depth_mult=0.34,
                encoder_pe=encoder_pe,
                sine_layout='released' if name == 'sine-released' else 'grid'))
            self.necks[-1].init_weights()
            # as deployed: each RepVGG block one conv (fewer ops to export)
            self.necks[-1].switch_to_deploy()

    def outputs(self, images, mask):
        feats = [conv(images) for conv in self.convs]
        outs = []
        for neck in self.necks:
            levels = neck(feats[-len(neck.in_channels):], mask)
            outs.append(torch.cat([level.flatten(2) for level in levels], 2))
        return tuple(outs)

    def forward(self, images, img_shapes):
        mask = padding_mask_from_img_shapes(img_shapes, images.shape[-2:])
        return self.outputs(images, mask)


def _inputs(batch, height, width, shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(batch, 3, height, width, generator=gen)
    shapes = shapes or [(height, width)] * batch
    for i, (h, w) in enumerate(shapes):
        images[i, :, h:] = 0
        images[i, :, :, w:] = 0
    return images, torch.tensor(shapes, dtype=torch.long)


@contextlib.contextmanager
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
    from torch.export import Dim
    with _one_thread(), torch.random.fork_rng():
        torch.manual_seed(0)
        model = _AllEncodings().eval()
        out = str(tmp_path_factory.mktemp('onnx') / 'rtdetr_necks.onnx')
        (batch, height, width), shapes = EXPORT
        images, img_shapes = _inputs(batch, height, width, shapes, seed=0)
        batch_dim = Dim('batch', min=1, max=1024)
        export_onnx(
            model, (images, img_shapes), out,
            input_names=('images', 'img_shapes'),
            output_names=tuple(ENCODINGS),
            dynamic_shapes={
                'images': {0: batch_dim, 2: Dim.DYNAMIC, 3: Dim.DYNAMIC},
                'img_shapes': {0: batch_dim}
            },
            optimize=False)
    return model, onnxruntime_session(out, num_threads=1)


@pytest.mark.parametrize('case', list(CASES))
def test_every_aifi_encoding_onnxruntime_equals_pytorch(exported, case):
    model, session = exported
    (batch, height, width), shapes = CASES[case]
    images, img_shapes = _inputs(batch, height, width, shapes, seed=1)
    mask = padding_mask_from_shapes(img_shapes.tolist(), (height, width))
    with torch.no_grad():
        want = model.outputs(images, mask)
    got = run_onnxruntime(session, dict(images=images, img_shapes=img_shapes))
    for name, g, w in zip(ENCODINGS, got, want):
        assert g.shape == w.shape, name
        assert max_abs_diff([g], [w]) < RTOL * w.abs().max(), name
    if shapes is not None:
        # the valid sizes are an input: the whole-batch mask differs
        full = torch.tensor([(height, width)] * batch)
        other = run_onnxruntime(session, dict(images=images, img_shapes=full))
        for name, o, g in zip(ENCODINGS, other, got):
            assert max_abs_diff([o], [g]) > 100 * RTOL * g.abs().max(), name
