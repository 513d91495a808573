"""CPVT with detectron2's settings (``window_padding='zeros'``,
``pos_embed_interp='detectron2'``) traces as the defaults do: one graph
(``torch.compile(fullgraph=True, dynamic=True)``) for every grid, whole
windows or not, with and without a padded batch; the outputs of eager."""
import pytest
import torch

from mmpe.models.backbones import CPVT

# grids of 3 x 3 windows: whole in neither side, in height only, in both
GRIDS = [(7, 8), (6, 7), (9, 6)]
TOL = dict(atol=1e-5, rtol=1e-5)  # float32, the same ops in other orders


@pytest.mark.parametrize('padded', [False, True], ids=['plain', 'padded'])
def test_detectron2_settings_one_graph(padded):
    torch.manual_seed(0)
    backbone = CPVT(
        arch=dict(embed_dims=32, depth=2, num_heads=4, mlp_ratio=2.),
        img_size=40, patch_size=8, out_indices=(0, 1),
        pos_encoding=('learnable', 'rel-pos'),
        rel_pos_cfg=dict(input_size=6), window_size=3, global_blocks=(1, ),
        window_padding='zeros', pos_embed_interp='detectron2',
        final_norm=False).eval()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(backbone, backend='eager', fullgraph=True,
                             dynamic=True)
    with torch.no_grad():
        for i, (h, w) in enumerate(GRIDS):
            g = torch.Generator().manual_seed(i)
            x = torch.randn(2, 3, 8 * h, 8 * w, generator=g)
            pad = None
            if padded:
                pad = torch.zeros(2, 8 * h, 8 * w, dtype=torch.bool)
                pad[1, -8:] = True
            for got, want in zip(compiled(x, pad), backbone(x, pad)):
                torch.testing.assert_close(got, want, **TOL)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
