"""RT-DETR's hybrid encoder compiles in one graph with symbolic sizes:
``torch.compile(fullgraph=True, dynamic=True)`` over five input sizes of a
padded batch compiles once and equals eager.

The case holds the neck's own per-call steps: the token mask from the pixel
mask, each image's valid extent, the released sin-cos layout per image,
normalised RoPE coordinates, the fusion's resizes to the lower level's size
(the relative terms of AIFI's attention are those of the DETR encoders in
``test_graph_breaks.py``). The backend only counts graphs (tracing, not
code generation).
"""
import pytest
import torch

from compile_cases import GRIDS
from mmpe.models.necks import RTDETRHybridEncoder
from mmpe.models.utils.padding_mask import padding_mask_from_shapes

# the traced graph runs the eager kernels: equal up to op reordering
TOL = dict(atol=1e-5, rtol=1e-5)
CASES = {
    'sine-released-rope-mixed-norm': dict(
        encoder_pe=dict(absolute='sine', relative=dict(
            type='rope-mixed', coords='normalized')),
        sine_layout='released'),
}


@pytest.mark.parametrize('case', list(CASES))
def test_neck_one_graph_no_recompile(case):
    torch.manual_seed(0)
    neck = RTDETRHybridEncoder(
        in_channels=[8, 16, 32], hidden_dim=32, num_heads=4,
        dim_feedforward=64, expansion=0.5, depth_mult=0.34, **CASES[case])
    neck.init_weights()
    neck.eval()
    inputs = []
    for h, w in GRIDS:  # the stride-32 grid; the second image padded
        shape = (32 * h, 32 * w)
        mask = padding_mask_from_shapes(
            [shape, (32 * (h - 2), 32 * (w - 3))], shape)
        feats = [torch.randn(2, c, 32 * h // s, 32 * w // s)
                 for c, s in ((8, 8), (16, 16), (32, 32))]
        inputs.append((feats, mask))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(neck, backend='eager', fullgraph=True,
                             dynamic=True)
    with torch.no_grad():
        for feats, mask in inputs:
            for got, want in zip(compiled(feats, mask), neck(feats, mask)):
                torch.testing.assert_close(got, want, **TOL)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
