"""RT-DETR's decoder side compiles in one graph with symbolic sizes:
``torch.compile(fullgraph=True, dynamic=True)`` over two input sizes (and
their valid ratios: a padded batch) compiles exactly once and equals eager,
for both sampling methods. The backend only counts graphs (tracing, not
code generation), as ``test_graph_breaks.py`` does."""
import pytest
import torch
from mmdet.registry import MODELS

from mmpe.models.detectors.rtdetr import valid_cells
from rtdetr_small import small_rtdetr_cfg

#: input sizes (h, w) of multiples of 32: maps of strides 8, 16, 32; the
#: first one's sides share no value with each other or the batch (dynamo
#: gives equal sizes of the first call one symbol)
SIZES = ((160, 96), (96, 64))
# the traced graph runs the same kernels: equal up to op reordering
TOL = dict(atol=1e-5, rtol=1e-5)


class DecoderSide(torch.nn.Module):
    """The detector's steps after the neck, with each image's valid
    ratios as a tensor (what an exported graph takes)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, f0, f1, f2, ratios):
        model = self.model
        memory, shapes = model.bbox_head.flatten_levels((f0, f1, f2))
        mask = valid_cells(ratios, shapes)
        enc_out = model.forward_encoder(memory, shapes, ratios, mask)
        dec_in, _ = model.pre_decoder(**enc_out)
        out = model.forward_decoder(
            **dec_in, spatial_shapes=shapes, memory_mask=mask,
            valid_ratios=ratios)
        return out['all_logits'], out['all_boxes']


@pytest.mark.parametrize('method', ['default', 'discrete'])
def test_decoder_side_one_graph_no_recompile(method):
    torch.manual_seed(0)
    model = MODELS.build(small_rtdetr_cfg(cross_attn_method=method)).eval()
    call = DecoderSide(model)
    gen = torch.Generator().manual_seed(0)
    inputs = []
    for h, w in SIZES:
        feats = [torch.randn(2, 32, h // s, w // s, generator=gen)
                 for s in (8, 16, 32)]
        ratios = torch.tensor([[1.0, 1.0], [0.75, 0.5]])
        inputs.append((*feats, ratios))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(call, backend='eager', fullgraph=True,
                             dynamic=True)
    with torch.no_grad():
        for args in inputs:
            got, want = compiled(*args), call(*args)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, **TOL)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
