"""The offset biases' tables (:mod:`mmpe.models.layers.grid_bias`) against
their authors' equations and code: Swin-V2's log-CPB (also the authors'
``WindowAttention`` construction and timm's ``RelPosMlp`` with the same
weights), CROMA's 2D ALiBi, LookHere's released bias; square and
non-square grids, forward and gradients, and controls that differ.

Expected values: ``tests/grid_bias_reference.py`` (per-pair loops written
from the papers' equations and the released code), timm.
"""
import pytest
import torch

from grid_bias_reference import (BF16_MAX, alibi_loop, croma_slopes,
                                 log_cpb_loop, lookhere_loop,
                                 swin_v2_window_bias)
from mmpe.models.layers.grid_bias.alibi_2d import ALiBi2D, alibi_slopes
from mmpe.models.layers.grid_bias.build import build_grid_bias
from mmpe.models.layers.grid_bias.log_cpb import LogCPB
from mmpe.models.layers.grid_bias.lookhere import LookHere

# float64 tables against float64 loops: the same operations up to order
F64_TOL = dict(atol=1e-10, rtol=1e-9)
# timm's RelPosMlp builds its coordinates in float32 (then the MLP of the
# module's dtype): float32 rounding of the log-spaced inputs
TIMM_TOL = dict(atol=1e-5, rtol=1e-5)
GRIDS = [(4, 4), (3, 5), (5, 2), (1, 4)]


def _log_cpb(heads=3, pretrained=(4, 6), hidden=16, seed=0):
    torch.manual_seed(seed)
    module = LogCPB(heads, pretrained, hidden=hidden).double()
    with torch.no_grad():  # away from the init's near-constant 8
        for p in module.parameters():
            p.normal_(0, 1)
    return module


def _mlp_leaves(module):
    w1, b1, w2 = (p.detach().clone().requires_grad_(True)
                  for p in (module.cpb_mlp[0].weight, module.cpb_mlp[0].bias,
                            module.cpb_mlp[2].weight))
    return w1, b1, w2


# ------------------------------------------------------------------ log-CPB
@pytest.mark.parametrize('grid', GRIDS)
def test_log_cpb_equals_pair_loop_forward_and_gradients(grid):
    module = _log_cpb()
    got = module(*grid)
    w1, b1, w2 = _mlp_leaves(module)
    want = log_cpb_loop(w1, b1, w2, grid, (4, 6))
    torch.testing.assert_close(got, want, **F64_TOL)
    grad = torch.randn(got.shape, dtype=got.dtype)
    got.backward(grad)
    want.backward(grad)
    mine = (module.cpb_mlp[0].weight, module.cpb_mlp[0].bias,
            module.cpb_mlp[2].weight)
    for a, b in zip(mine, (w1, b1, w2)):
        torch.testing.assert_close(a.grad, b.grad, **F64_TOL)
    # controls: another pre-training window, the axes swapped
    other = log_cpb_loop(w1, b1, w2, grid, (6, 4)).detach()
    assert not torch.allclose(got.detach(), other, **F64_TOL)
    swapped = log_cpb_loop(w1.flip(1), b1, w2, grid, (6, 4)).detach()
    assert not torch.allclose(got.detach(), swapped, **F64_TOL)


@pytest.mark.parametrize('window,pretrained', [((4, 4), (4, 4)),
                                               ((3, 5), (3, 5)),
                                               ((6, 7), (4, 4))])
def test_log_cpb_equals_swin_v2_window_attention_table(window, pretrained):
    """The authors' construction with the same MLP; (6, 7) at a 4 x 4
    pre-training window: the offsets beyond it, log-extrapolated."""
    module = _log_cpb(pretrained=pretrained)
    want = swin_v2_window_bias(module.cpb_mlp, window, pretrained)
    torch.testing.assert_close(module(*window), want, **F64_TOL)


@pytest.mark.parametrize('window,pretrained', [((4, 4), (4, 4)),
                                               ((3, 5), (2, 6))])
def test_log_cpb_equals_timm_rel_pos_mlp(timm, window, pretrained):
    """timm's ``RelPosMlp(mode='swin')`` (Swin-V2's bias) with the same
    weights, and its ``prefix_tokens``: zeros for a class token."""
    from timm.layers.pos_embed_rel import RelPosMlp
    module = _log_cpb(heads=4, pretrained=pretrained, hidden=512)
    ref = RelPosMlp(window, 4, hidden_dim=512, mode='swin',
                    pretrained_window_size=pretrained, prefix_tokens=1)
    ref = ref.double().eval()
    with torch.no_grad():
        ref.mlp.fc1.weight.copy_(module.cpb_mlp[0].weight)
        ref.mlp.fc1.bias.copy_(module.cpb_mlp[0].bias)
        ref.mlp.fc2.weight.copy_(module.cpb_mlp[2].weight)
    want = ref.get_bias()[0]  # (H, 1 + L, 1 + L)
    term = module.term(torch.zeros(1, 4, 1 + window[0] * window[1], 8,
                                   dtype=torch.float64), *window)
    torch.testing.assert_close(term.dense()[0][0], want, **TIMM_TOL)


# ------------------------------------------------------------------ ALiBi
@pytest.mark.parametrize('heads', [1, 2, 6, 8, 12, 16])
def test_alibi_slopes_equal_croma(heads):
    assert alibi_slopes(heads) == pytest.approx(croma_slopes(heads),
                                                rel=1e-15)


@pytest.mark.parametrize('grid', GRIDS)
@pytest.mark.parametrize('heads', [8, 12])
def test_alibi_equals_pair_loop(grid, heads):
    got = ALiBi2D(heads)(*grid, dtype=torch.float64)
    want = alibi_loop(heads, grid)
    torch.testing.assert_close(got, want, **F64_TOL)
    # control: the heads' slopes in the other order
    assert not torch.allclose(got, want.flip(0), **F64_TOL)


# ------------------------------------------------------------------ LookHere
LOOKHERE_CASES = [
    ('corners', 8, {}),
    ('halves', 4, dict(distance='square')),
    ('triangles', 8, dict(global_slope=1.5, layer_slopes=(1.5, 0.5),
                          layer=2, num_layers=4)),
    ('diagonals', 4, dict(distance='sqrt')),
    ('eighths1-eighths2-none', 12, {}),
    ('corners-zerotriangles', 12, dict(layer_slopes=(2.0, 0.5), layer=3,
                                       num_layers=4)),
    ('halves-none', 6, {}),
    ('none', 4, {}),
]


@pytest.mark.parametrize('grid', GRIDS[:3] + [(6, 3)])
@pytest.mark.parametrize('directions,heads,kwargs', LOOKHERE_CASES,
                         ids=[c[0] + f'-{c[1]}' for c in LOOKHERE_CASES])
def test_lookhere_equals_released_bias(grid, directions, heads, kwargs):
    got = LookHere(heads, directions, **kwargs)(*grid, dtype=torch.float64)
    ref_kwargs = dict(kwargs)
    if 'num_layers' in ref_kwargs:
        ref_kwargs['depth'] = ref_kwargs.pop('num_layers')
    want = lookhere_loop(directions, heads, grid, **ref_kwargs)
    # masked pairs: the released largest bfloat16, mmpe's -2^14 (the same
    # zero probabilities; lookhere.py's docstring says why)
    masked = want == -BF16_MAX
    assert torch.equal(got == -2.0**14, masked)
    torch.testing.assert_close(got[~masked], want[~masked], **F64_TOL)
    assert not masked.diagonal(dim1=-2, dim2=-1).any()  # self seen
    # control: the query / key roles swapped (the mirrored directions)
    if directions != 'none':
        assert not torch.allclose(got, want.transpose(-1, -2), **F64_TOL)


def test_lookhere_masked_value_is_exact_in_every_dtype():
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        table = LookHere(4, 'halves').table(3, 3, torch.device('cpu'), dtype)
        assert torch.isfinite(table).all() and table.min() == -2.0**14


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize('cfg,match', [
    (dict(type='log-cpb'), r'needs `pretrained_size`'),
    (dict(type='log-cpb', pretrained_size=1), r'`pretrained_size` 1.*>= 2'),
    (dict(type='log-cpb', pretrained_size=(4, 4), hidden=0), r'`hidden` 0'),
    (dict(type='alibi-2d', slopes=1), r"\['slopes'\] for type 'alibi-2d'"),
    (dict(type='alibi'), r"`bias_cfg`.*\('log-cpb', 'alibi-2d', 'lookhere'"),
    (dict(type='lookhere', directions='center'), r"'center'.*absolute"),
    (dict(type='lookhere', directions='sideways'), r"`directions` 'sideways'"),
    (dict(type='lookhere', directions='corners-halves'),
     r'num_heads=8.*\(heads, parts\)'),
    (dict(type='lookhere', distance='cube'), r"`distance` 'cube'"),
    (dict(type='lookhere', global_slope=0), r'global_slope=0'),
    (dict(type='lookhere', layer_slopes=(1, )), r'layer_slopes=\(1,\)'),
    (dict(type='lookhere', layer=4, num_layers=4), r'`layer` 4.*\[0, 3\]'),
])
def test_bad_arguments_name_the_value_and_choices(cfg, match):
    with pytest.raises(ValueError, match=match):
        build_grid_bias(cfg, 8)
