"""The decoders with BoxRPB (``decoder_pe``) compile in one graph with a
symbolic grid: ``torch.compile(fullgraph=True, dynamic=True)`` over five
grids (a padded image in each batch) compiles exactly once and equals eager,
in inference (backend ``eager``) and in training with the backward
(``aot_eager``; the explicit backend as the custom op ``mmpe::attention``
and the chunked one).
"""
import copy
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmengine.config import Config

from compile_cases import GRIDS, feature_batch

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
QUICK = osp.join(ROOT, 'configs', 'quickstart')
CONFIGS = ('dab-detr_box-rpb_r18_synthetic.py',
           'conditional-detr_point-rpb_r18_synthetic.py')
# the traced graph runs the eager kernels: equal up to op reordering
TOL = dict(atol=1e-5, rtol=1e-5)


def _detector(name, **decoder_pe):
    cfg = copy.deepcopy(Config.fromfile(osp.join(QUICK, name)).model)
    cfg.encoder.num_layers = 1
    cfg.decoder.num_layers = 2
    cfg.decoder_pe.update(decoder_pe)
    torch.manual_seed(0)
    model = MODELS.build(cfg)
    model.init_weights()
    for p in model.decoder.box_rpb.parameters():  # a bias that matters
        p.data.normal_(std=0.3)
    return model.eval()


class DecoderCall(torch.nn.Module):
    """Sine encoding, encoder, decoder and head of a feature map
    ``(B, C, h, w)`` and its mask ``(B, h, w)``, the grid read from the
    map's shape inside the call (as ``pre_transformer`` does)."""

    def __init__(self, detector) -> None:
        super().__init__()
        self.detector = detector

    def forward(self, feat: torch.Tensor, mask: torch.Tensor):
        det = self.detector
        height, width = feat.shape[-2:]
        # (B, C, h, w) -> (B, h * w, C)
        pos = det.positional_encoding(mask).flatten(2).transpose(1, 2)
        tokens = feat.flatten(2).transpose(1, 2)
        flat_mask = mask.flatten(1)
        memory = det.forward_encoder(tokens, flat_mask, pos,
                                     (height, width))['memory']
        tmp, head_in = det.pre_decoder(memory)
        head_in.update(
            det.forward_decoder(
                **tmp,
                memory_mask=flat_mask,
                memory_pos=pos,
                spatial_shape=(height, width)))
        scores, boxes = det.bbox_head.forward(**head_in)
        return scores[-1], boxes[-1]


@pytest.mark.parametrize('name', CONFIGS)
def test_inference_one_graph_no_recompile(name):
    call = DecoderCall(_detector(name))
    inputs = [feature_batch(g, call.detector.embed_dims) for g in GRIDS]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(call, backend='eager', fullgraph=True,
                             dynamic=True)
    with torch.no_grad():
        for args in inputs:
            for got, want in zip(compiled(*args), call(*args)):
                torch.testing.assert_close(got, want, **TOL)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1


@pytest.mark.parametrize('impl', ['explicit', 'chunked'])
@pytest.mark.parametrize('name', CONFIGS)
def test_training_one_graph_with_backward(name, impl):
    """Forward and backward through AOTAutograd: one graph for three grids,
    the MLPs' gradients of eager."""
    call = DecoderCall(_detector(name, attn_impl=impl, chunk_size=3)).train()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(call, backend='aot_eager', fullgraph=True,
                             dynamic=True)
    params = dict(call.detector.decoder.box_rpb.named_parameters())
    for grid in GRIDS[:3]:
        args = feature_batch(grid, call.detector.embed_dims)
        grads = []
        for fn in (compiled, call):
            call.zero_grad()
            torch.manual_seed(0)  # the same dropout draws
            scores, boxes = fn(*args)
            (scores.square().mean() + boxes.mean()).backward()
            grads.append({n: p.grad.clone() for n, p in params.items()})
        for key in grads[1]:
            torch.testing.assert_close(grads[0][key], grads[1][key], **TOL,
                                       msg=key)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
