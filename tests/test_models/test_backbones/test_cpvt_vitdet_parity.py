"""CPVT against detectron2's ViTDet (``window_padding``, ``pos_embed_interp``).

The reference is detectron2's ``ViT`` written out from its equations in
``tests/vitdet_d2_reference.py`` (a loop over S x S windows with zero tokens
past the grid, the decomposed relative position with its linear table
resize, ``get_abs_pos``), on CPVT's weights renamed to detectron2's keys.
``window_padding='zeros'`` with ``pos_embed_interp='detectron2'`` equals it
on a 10 x 13 grid with 4 x 4 windows, forward and backward (input and every
parameter); ``'masked'`` does not (the edge windows differ), and stays what
it was: the default, and the outputs recorded from the code before the
option existed.
"""
import os.path as osp
import sys

import pytest
import torch

from mmpe.models.backbones import CPVT
from mmpe.models.layers.blocks.vit_block import ViTBlock
from mmpe.models.layers.encodings.pos_embed_2d import resample_pos_embed
from mmpe.models.layers.windows.window import partition_grid, window_key_mask

from vitdet_d2_reference import NET, get_abs_pos, vit_forward

ARCH = dict(embed_dims=32, depth=3, num_heads=2, mlp_ratio=2.)
PATCH = 8
WINDOW = 4
GLOBAL = (1, )
WINDOW_BLOCKS = (0, 2)
IMG = (80, 104)  # 10 x 13 patches: neither side whole 4 x 4 windows
D2 = dict(window_padding='zeros', pos_embed_interp='detectron2')
# float64: detectron2's order of sums against mmpe's (mmpe computes q . R
# as (q / sqrt(d)) . (sqrt(d) R) and sums the terms in another order)
_F64_ATOL = 1e-12
RECORDED = osp.join(
    osp.dirname(__file__), 'fixtures', 'cpvt_masked_window_outputs.pt')
# float64 recorded outputs on the recorded weights: 0 on the machine that
# recorded them (same kernels); another CPU may sum the matrix products in
# another order
_RECORDED_ATOL = 1e-12
# ... but 'learnable+rel-pos' resamples its 7 x 7 table to the 10 x 13 grid
# in float32 (as timm), whose last bits depend on the CPU's interpolation
# kernel (torch's scalar kernels against its AVX-512 ones): 2e-7 in the
# outputs, 2e-6 in gradients of size ~30
_RECORDED_RESAMPLED_ATOL = 1e-5


def _model(seed=0, **kwargs):
    """ViTDet's backbone in small: absolute 7 x 7 table, decomposed
    relative position (global tables for 8 x 8), no final norm; every
    parameter random (tables non-zero, as after training)."""
    torch.manual_seed(seed)
    args = dict(
        arch=ARCH, patch_size=PATCH, img_size=56,
        pos_encoding=('learnable', 'rel-pos'),
        rel_pos_cfg=dict(input_size=(8, 8)), window_size=WINDOW,
        global_blocks=GLOBAL, final_norm=False, out_indices=(-1, ))
    args.update(kwargs)
    model = CPVT(**args).double().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if 'norm' in name and name.endswith('weight'):
                param.normal_(1, 0.1)
            else:
                param.normal_(0, 0.5 if 'pos' in name else 0.2)
    return model


def _as_detectron2(model, cls_row):
    """CPVT's weights under detectron2's names, as leaf copies (the class
    row of the table, dropped by get_abs_pos, prepended)."""
    sd = {}
    for name, value in model.state_dict().items():
        value = value.detach().clone()
        if name == 'pos_embed':
            key, value = NET + 'pos_embed', torch.cat([cls_row, value], 1)
        elif name.startswith('patch_embed.'):
            key = NET + 'patch_embed.proj.' + name.split('.')[-1]
        else:
            key = NET + name.replace('attn.rel_pos.table_', 'attn.rel_pos_')
        sd[key] = value.requires_grad_()
    return sd


def _grad_of(sd, name):
    """The gradient of CPVT's parameter ``name`` in ``sd``'s names."""
    if name == 'pos_embed':
        return sd[NET + 'pos_embed'].grad[:, 1:]
    if name.startswith('patch_embed.'):
        return sd[NET + 'patch_embed.proj.' + name.split('.')[-1]].grad
    return sd[NET + name.replace('attn.rel_pos.table_',
                                 'attn.rel_pos_')].grad


def _images(size=IMG, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, *size, generator=g, dtype=torch.float64)


def _check_against_reference(model, x, key_mask=None, padding_mask=None):
    """Outputs, input and parameter gradients of ``model`` equal the
    reference's on the tokens of ``key_mask``'s valid region."""
    g = torch.Generator().manual_seed(5)
    cls_row = torch.randn(1, 1, ARCH['embed_dims'], generator=g,
                          dtype=torch.float64)
    sd = _as_detectron2(model, cls_row)
    x_ref = x.clone().requires_grad_()
    x = x.clone().requires_grad_()
    out = model(x, padding_mask=padding_mask)[-1]
    want = vit_forward(sd, x_ref, ARCH['num_heads'], WINDOW, WINDOW_BLOCKS,
                       key_mask=key_mask)
    weight = torch.randn(out.shape, generator=g, dtype=torch.float64)
    if key_mask is not None:  # compare (and train) the valid tokens only
        weight = weight.masked_fill(key_mask[:, None], 0.)
        assert (out.masked_select(key_mask[:, None]) == 0).all()
        out = out.masked_fill(key_mask[:, None], 0.)
        want = want.masked_fill(key_mask[:, None], 0.)
    torch.testing.assert_close(out, want, atol=_F64_ATOL, rtol=0)
    (out * weight).sum().backward()
    (want * weight).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=_F64_ATOL, rtol=0)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, _grad_of(sd, name),
                                   atol=_F64_ATOL, rtol=0, msg=name)
    return out, want


@pytest.mark.parametrize('attn_impl', ['explicit', 'chunked', 'auto'])
def test_zeros_equals_detectron2_on_a_grid_of_partial_windows(attn_impl):
    model = _model(attn_impl=attn_impl, **D2)
    assert [b.window_size for b in model.blocks] == [WINDOW, 0, WINDOW]
    out, _ = _check_against_reference(model, _images())
    assert out.shape == (2, ARCH['embed_dims'], 10, 13)


def test_masked_differs_from_detectron2_at_the_edge_windows():
    """The same weights with masked window padding: the windows that hold
    padding give other features (the check above has power)."""
    zeros = _model(**D2)
    masked = _model(window_padding='masked', pos_embed_interp='detectron2')
    masked.load_state_dict(zeros.state_dict())
    x = _images()
    with torch.no_grad():
        diff = (zeros(x)[-1] - masked(x)[-1]).abs()
    assert diff.amax() > 1e-2
    # rows 0-7 / columns 0-11 of block 0's windows hold no padding, but
    # the global block 1 spreads the difference everywhere: compare the
    # block-0 tokens instead
    with torch.no_grad():
        t_zero = zeros.forward_tokens(x)[0][0]
        t_mask = masked.forward_tokens(x)[0][0]
    grid = (t_zero - t_mask).abs().amax(-1).reshape(2, 10, 13)
    assert (grid[:, :8, :12] == 0).all()
    assert (grid[:, 8:] > 0).all() and (grid[:, :, 12:] > 0).all()


def test_zeros_and_masked_are_the_same_on_whole_windows():
    """On a grid of whole windows nothing is padded: the two modes are one
    computation (bit for bit), and equal the reference."""
    zeros = _model(**D2)
    masked = _model(window_padding='masked', pos_embed_interp='detectron2')
    masked.load_state_dict(zeros.state_dict())
    x = _images((64, 96))  # 8 x 12 patches
    with torch.no_grad():
        assert torch.equal(zeros(x)[-1], masked(x)[-1])
    _check_against_reference(zeros, x)


def test_zeros_in_a_padded_batch_masks_the_batch_padding_only():
    """With a pixel padding mask the batch padding stays masked keys (and
    zero outputs); the window padding past the batch grid is zero tokens,
    as in detectron2. Reference: the same, written out."""
    model = _model(**D2)
    x = _images()
    mask = torch.zeros(2, *IMG, dtype=torch.bool)
    mask[1, 56:] = True  # image 1: 7 x 9 patches of the 10 x 13 grid
    mask[1, :, 72:] = True
    x = x.masked_fill(mask[:, None], 0.)
    key_mask = mask[:, ::PATCH, ::PATCH]
    _check_against_reference(model, x, key_mask, padding_mask=mask)


def _table_added(model, size=IMG):
    """What the model adds to the patch tokens for an input of ``size``:
    block 0's input with the patch embedding zeroed."""
    seen = []
    hook = model.blocks[0].register_forward_pre_hook(
        lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        model.patch_embed.weight.zero_()
        model.patch_embed.bias.zero_()
        model(torch.zeros(1, 3, *size, dtype=torch.float64))
    hook.remove()
    return seen[0]


def test_detectron2_interpolation_is_get_abs_pos():
    """``'detectron2'``: get_abs_pos's plain bicubic in the table's dtype;
    ``'timm'`` (the default): torch's antialiased bicubic in float32, as
    before; the two differ when enlarging a 7 x 7 table to 10 x 13."""
    d2, timm = _model(**D2), _model()
    timm.load_state_dict(d2.state_dict())
    table = d2.pos_embed.detach().clone()
    with_cls = torch.cat([torch.zeros(1, 1, 32, dtype=torch.float64), table],
                         1)
    want = get_abs_pos(with_cls, (10, 13)).reshape(1, 130, 32)
    torch.testing.assert_close(_table_added(d2), want, atol=_F64_ATOL,
                               rtol=0)
    grid = table.reshape(1, 7, 7, 32).permute(0, 3, 1, 2).float()
    timm_want = torch.nn.functional.interpolate(
        grid, size=(10, 13), mode='bicubic', align_corners=False,
        antialias=True).flatten(2).transpose(1, 2).double()
    got = _table_added(timm)
    assert torch.equal(got, timm_want)
    assert torch.equal(got, resample_pos_embed(table, (7, 7), (10, 13)))
    assert (got - want).abs().amax() > 0.05


def test_masked_is_the_default_bit_for_bit():
    """The default model is the explicit 'masked' / 'timm' one: the same
    outputs and gradients, bit for bit (a padded batch, all encodings
    that take windows)."""
    for enc in (dict(pos_encoding=('learnable', 'rel-pos')),
                dict(pos_encoding='rope2d'), dict(pos_encoding='irpe')):
        outs = []
        for extra in ({}, dict(window_padding='masked',
                               pos_embed_interp='timm')):
            kwargs = dict(enc, **extra)
            if 'rel-pos' not in str(enc['pos_encoding']):
                kwargs['rel_pos_cfg'] = None
            model = _model(**kwargs)
            x = _images().requires_grad_()
            mask = torch.zeros(2, *IMG, dtype=torch.bool)
            mask[1, 60:] = True
            out = model(x, padding_mask=mask)[-1]
            out.sum().backward()
            outs.append([out.detach(), x.grad] +
                        [p.grad for p in model.parameters()])
        for a, b in zip(*outs):
            assert torch.equal(a, b)


# ------------------------------------------- recorded before the option
#: name -> CPVT arguments that existed before ``window_padding``
RECORDED_MODELS = {
    'learnable+rel-pos': dict(pos_encoding=('learnable', 'rel-pos'),
                              rel_pos_cfg=dict(input_size=(8, 8))),
    'irpe': dict(pos_encoding='irpe'),
    'rope2d': dict(pos_encoding='rope2d'),
}


def _recorded_model(name, state=None):
    """Small (16 channels, one input channel, 4 px patches) so that the
    file of every gradient stays small; with the recorded weights
    ``state``, or (to record) drawn in float32 and cast to float64."""
    torch.manual_seed(0)
    model = CPVT(arch=dict(ARCH, embed_dims=16), patch_size=4,
                 in_channels=1, img_size=28, window_size=WINDOW,
                 global_blocks=GLOBAL, out_indices=(2, ),
                 **RECORDED_MODELS[name])
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.3)
    model = model.double().eval()
    if state is not None:
        model.load_state_dict(state, strict=True)
    return model


def _recorded_run(model):
    """Outputs, input gradient and parameter gradients on a padded batch
    whose grid (10 x 13) is not whole windows, with and without the mask."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 1, 40, 52, generator=g, dtype=torch.float64)
    mask = torch.zeros(2, 40, 52, dtype=torch.bool)
    mask[1, 22:] = True
    mask[1, :, 35:] = True
    x = x.masked_fill(mask[:, None], 0.)
    run = {}
    for key, pm in (('plain', None), ('masked', mask)):
        model.zero_grad()
        xg = x.clone().requires_grad_()
        outs = model(xg, padding_mask=pm)
        g = torch.Generator().manual_seed(7)
        sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum()
            for o in outs).backward()
        run[key] = dict(
            outputs=[o.detach() for o in outs], x_grad=xg.grad,
            grads={n: p.grad.clone() for n, p in model.named_parameters()})
    return run


def record_masked_outputs(path: str = RECORDED) -> None:
    """How the fixture was made, on the code before ``window_padding``
    (commit b7b932c, with its compiled kernel)::

        PYTHONPATH=<that checkout> python \\
            tests/test_models/test_backbones/test_cpvt_vitdet_parity.py \\
            --record

    Each model's weights (``state``) are recorded with its run: they are
    drawn in float32 by torch's CPU kernels, whose last bits depend on the
    CPU (torch's scalar kernels against its AVX-512 ones: ~1e-7 apart), so
    the test loads them instead of drawing them again. Being float32
    values, they are stored as float32 (exactly). They were added to the
    runs recorded at b7b932c later, on a CPU whose draws reproduced those
    runs exactly (0.0).
    """
    record = {}
    for name in RECORDED_MODELS:
        model = _recorded_model(name)
        state = model.state_dict()
        for key, value in state.items():
            assert torch.equal(value.float().double(), value), key
        record[name] = dict(_recorded_run(model),
                            state={k: v.float() for k, v in state.items()})
    torch.save(record, path)


@pytest.mark.parametrize('name', RECORDED_MODELS)
def test_masked_outputs_are_those_recorded_before_the_option(name):
    record = torch.load(RECORDED, weights_only=True)[name]
    run = _recorded_run(_recorded_model(name, record['state']))
    atol = _RECORDED_RESAMPLED_ATOL if 'learnable' in name else \
        _RECORDED_ATOL
    for key in ('plain', 'masked'):
        for out, want in zip(run[key]['outputs'], record[key]['outputs']):
            torch.testing.assert_close(out, want, atol=atol, rtol=0)
        torch.testing.assert_close(run[key]['x_grad'], record[key]['x_grad'],
                                   atol=atol, rtol=0)
        assert run[key]['grads'].keys() == record[key]['grads'].keys()
        for pname, grad in run[key]['grads'].items():
            torch.testing.assert_close(grad, record[key]['grads'][pname],
                                       atol=atol, rtol=0, msg=pname)


# ------------------------------------------------------------ layout
def test_zeros_key_mask_is_the_batch_padding_only():
    """``window_key_mask(padding='zeros')``: None without a mask; with one,
    each window's keys are masked where the grid's mask is, never past the
    grid (checked token by token)."""
    assert window_key_mask(None, 2, (5, 7), 3, 'cpu', 'zeros') is None
    mask = torch.zeros(2, 5, 7, dtype=torch.bool)
    mask[1, 3:] = True
    got = window_key_mask(mask.flatten(1), 2, (5, 7), 3, 'cpu', 'zeros')
    assert got.shape == (2 * 2 * 3, 9)
    for b in range(2):
        for wi in range(2):
            for wj in range(3):
                win = (b * 2 + wi) * 3 + wj
                for r in range(3):
                    for c in range(3):
                        y, x = wi * 3 + r, wj * 3 + c
                        inside = y < 5 and x < 7
                        assert got[win, r * 3 + c] == (
                            inside and bool(mask[b, y, x]))
    # the windows' tokens past the grid are zeros (the zero tokens)
    tokens = torch.ones(1, 5, 7, 4)
    windows = partition_grid(tokens, 3)
    assert windows.sum() == 5 * 7 * 4


@pytest.mark.parametrize('kwargs, match', [
    (dict(window_padding='zero'),
     r"Unsupported `window_padding` 'zero', please choose from "
     r"\('masked', 'zeros'\)"),
    (dict(pos_embed_interp='bicubic'),
     r"Unsupported `pos_embed_interp` 'bicubic', please choose from "
     r"\('timm', 'detectron2', 'dinov2', 'dinov2-reg'\)"),
    (dict(window_padding='zeros', pos_encoding='rope2d', rel_pos_cfg=None),
     r"`window_padding='zeros'` with pos_encoding 'rope2d'.*"
     r"choose window_padding='masked'"),
    (dict(window_padding='zeros', pos_encoding=('peg', 'rope-mixed'),
          rel_pos_cfg=None),
     r"`window_padding='zeros'` with pos_encoding 'rope-mixed'"),
    (dict(pos_embed_interp='detectron2', pos_encoding='rel-pos'),
     r"`pos_embed_interp='detectron2'` resamples the 'learnable' table.*"
     r"add 'learnable' or leave pos_embed_interp='timm'"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _model(**kwargs)


@pytest.mark.parametrize('encoding', [
    dict(pos_encoding='irpe'),
    # the PEG after block 1, so that block 0's tokens are its output
    dict(pos_encoding=('peg', 'sine'), peg_positions=(1, ))
])
def test_zeros_with_other_encodings(encoding):
    """iRPE in windows: the zero tokens are keys at their window positions;
    PEG / sin-cos act outside the blocks. As in every mode, the tokens of
    windows without padding are those of 'masked' (block 0's output), the
    edge windows' are not."""
    zeros = _model(**encoding, rel_pos_cfg=None, window_padding='zeros')
    masked = _model(**encoding, rel_pos_cfg=None)
    masked.load_state_dict(zeros.state_dict())
    x = _images()
    with torch.no_grad():
        t_zero = zeros.forward_tokens(x)[0][0]
        t_mask = masked.forward_tokens(x)[0][0]
    grid = (t_zero - t_mask).abs().amax(-1).reshape(2, 10, 13)
    assert (grid[:, :8, :12] == 0).all()
    assert (grid[:, 8:] > 0).all() and (grid[:, :, 12:] > 0).all()


def test_zeros_without_windows_and_in_the_block():
    # no window: the choice changes nothing
    model = _model(window_size=0, window_padding='zeros',
                   pos_embed_interp='detectron2')
    ref = _model(window_size=0, pos_embed_interp='detectron2')
    x = _images((40, 48))
    with torch.no_grad():
        assert torch.equal(model(x)[-1], ref(x)[-1])
    with pytest.raises(ValueError, match=r"`window_padding` 'pad'"):
        ViTBlock(16, 2, window_size=3, window_padding='pad')
    block = ViTBlock(16, 2, window_size=3, window_padding='zeros')
    assert "window_padding='zeros'" in repr(block)
    cos = torch.ones(20, 8)
    with pytest.raises(ValueError, match=r"window_padding='zeros' with RoPE"):
        block(torch.randn(1, 20, 16), (4, 5), (cos, cos))


if __name__ == '__main__' and '--record' in sys.argv:
    record_masked_outputs()
