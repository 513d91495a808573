"""CPVT with ViTDet's windows: equal to a per-window loop written here, for
every position encoding, on grids that are not whole windows and in padded
batches (forward and backward); RoPE rotates each token by its full-grid
position in both kinds of block; ``window_size=0`` is the backbone of
before (outputs recorded from mmpe 0.1's CPVT, with its float64 weights),
its checkpoints load; bad arguments are named.

The reference (:class:`LoopWindows`) runs each window block as the global
block (already tested against DeiT / timm and the iRPE authors) once per
image and window, on the window's tokens inside the grid (a sub-grid of at
most S x S), with the key mask of those tokens and the rows of the full-grid
RoPE tables those tokens own. With ``'rel-pos'`` it runs on the whole
``S x S`` window instead (zeros past the grid, masked keys): ViTDet pads
each window to ``S x S``, and a window's tables (``2 S - 1`` rows) are read
at the offsets on that grid, never resized to the part inside the grid.
The offset biases (log-CPB, 2D ALiBi, LookHere) depend on the offsets
only: the loop's sub-grid gets the window's bias (log-CPB's offsets
normalised by the window ``(S, S)`` in window blocks).
"""
import copy
import os.path as osp
import sys

import pytest
import torch

from mmpe.models.backbones import CPVT

SMALL = dict(embed_dims=16, depth=3, num_heads=2, mlp_ratio=2.)
PATCH = 8
WINDOW = 3
GLOBAL = (1, )
#: name -> CPVT arguments
ENCODINGS = {
    'peg': dict(pos_encoding='peg', peg_positions=(0, 1)),
    'none': dict(pos_encoding='none'),
    'learnable': dict(pos_encoding='learnable'),
    'sine': dict(pos_encoding='sine'),
    'rope2d': dict(pos_encoding='rope2d'),
    'rope-mixed': dict(pos_encoding='rope-mixed'),
    'irpe': dict(pos_encoding='irpe'),
    'irpe-bias-qk': dict(
        pos_encoding='irpe',
        rpe_cfg=dict(mode='bias', method='cross', rpe_on='qk')),
    'irpe-qkv': dict(pos_encoding='irpe', rpe_cfg=dict(rpe_on='qkv')),
    'sine+peg+irpe': dict(pos_encoding=('sine', 'peg', 'irpe')),
}
#: the encodings recorded from the CPVT of before windows (RECORDED)
RECORDED_ENCODINGS = tuple(ENCODINGS)
ENCODINGS.update({
    # global block 1: tables for the pre-training grid (4, 4), resized to
    # the input's grid; window blocks 0 and 2: tables for (3, 3)
    'rel-pos': dict(pos_encoding='rel-pos'),
    # ViTDet's own backbone; tables made for another grid than the input's
    'learnable+rel-pos': dict(pos_encoding=('learnable', 'rel-pos'),
                              rel_pos_cfg=dict(input_size=(6, 5))),
    # the offset biases: log-CPB's window blocks normalise by (3, 3), its
    # global block by the pre-training grid (4, 4); LookHere's 'halves'
    # needs a multiple of 4 heads
    'log-cpb': dict(pos_encoding='log-cpb', bias_cfg=dict(hidden=16)),
    'alibi-2d': dict(pos_encoding='alibi-2d'),
    'lookhere': dict(pos_encoding='lookhere', arch=dict(SMALL, num_heads=4),
                     bias_cfg=dict(directions='halves',
                                   layer_slopes=(1.5, 0.5))),
})
_F64_ATOL = 1e-10  # float64: the same sums in another order
# float64 outputs of size ~1 on the recorded float64 weights: the same
# sums, perhaps in another order on another CPU
RECORDED_ATOL = 1e-12
# ... but 'learnable' resamples its (4, 4) table to the (3, 5) grid in
# float32 (as timm), whose last bits depend on the CPU's interpolation
# kernel: ~2e-7 in the outputs (torch's scalar kernels against its AVX-512
# ones); a changed backbone moves them by ~0.1
RECORDED_RESAMPLED_ATOL = 1e-6
RECORDED = osp.join(
    osp.dirname(__file__), 'fixtures', 'cpvt_global_outputs.pt')


def _model(window_size=WINDOW, seed=0, **kwargs):
    torch.manual_seed(seed)
    model = CPVT(
        arch=kwargs.pop('arch', SMALL), patch_size=PATCH, img_size=32,
        out_indices=(0, 1, 2), window_size=window_size, global_blocks=GLOBAL,
        **kwargs)
    with torch.no_grad():  # non-zero tables, as after training
        for name, param in model.named_parameters():
            if any(k in name for k in ('rpe', 'pos_embed', 'rel_pos',
                                       'grid_bias')):
                param.normal_(0, 0.5)
    return model.double().eval()


class LoopWindows(torch.nn.Module):
    """A window block as a loop: the same block, global, on each window.

    For image b and window (i, j), the tokens of rows ``i S .. i S + S - 1``
    and columns ``j S .. j S + S - 1`` that lie in the grid form an
    ``(hh, ww)`` sub-grid; the global block runs on it with its key mask and
    the RoPE rows of its tokens. A window whose tokens are all padding is
    left as it is (its tokens are padding: masked keys everywhere, zeroed
    at the output). A block with the decomposed relative position runs on
    the whole ``S x S`` window (see :meth:`_whole_window`).
    """

    def __init__(self, block, window_size):
        super().__init__()
        self.block = block
        self.s = window_size

    def forward(self, x, hw_shape, rope=None, key_padding_mask=None):
        h, w = hw_shape
        s = self.s
        out = x.clone()
        for b in range(x.shape[0]):
            for r0 in range(0, h, s):
                for c0 in range(0, w, s):
                    rows = range(r0, min(r0 + s, h))
                    cols = range(c0, min(c0 + s, w))
                    idx = torch.tensor([r * w + c for r in rows
                                        for c in cols])
                    mask = None
                    if key_padding_mask is not None:
                        mask = key_padding_mask[b:b + 1, idx]
                        if mask.all():
                            continue
                    if self.block.attn.rel_pos is not None:
                        # window-local index of each token in the grid
                        local = torch.tensor([(r - r0) * s + c - c0
                                              for r in rows for c in cols])
                        out[b, idx] = self._whole_window(
                            x[b, idx], local, mask)
                        continue
                    sub_rope = None
                    if rope is not None:
                        sub_rope = tuple(t[..., idx, :] for t in rope)
                    out[b, idx] = self.block(x[b:b + 1, idx],
                                             (len(rows), len(cols)),
                                             sub_rope, mask)[0]
        return out

    def _whole_window(self, tokens, local, mask):
        """The block on one ``S x S`` window holding ``tokens`` (N, C) at
        the window-local indices ``local``: zeros elsewhere, masked as keys
        (with the batch padding ``mask`` (1, N) of the tokens), so the
        tables are read at the offsets of the ``(S, S)`` grid."""
        s = self.s
        window = tokens.new_zeros(1, s * s, tokens.shape[-1])
        window[0, local] = tokens
        keys = torch.ones(1, s * s, dtype=torch.bool)
        keys[0, local] = False if mask is None else mask[0]
        return self.block(window, (s, s), None, keys)[0, local]


def _reference(model, name):
    """The windowed ``model``'s weights in a global CPVT whose window
    blocks are :class:`LoopWindows`."""
    if 'rel-pos' in name or 'log-cpb' in name:
        # the window blocks' tables (log-CPB: offsets) are for (S, S), not
        # the global grid of a model built without windows: a copy with
        # global blocks
        ref = copy.deepcopy(model)
        for i, block in enumerate(ref.blocks):
            block.window_size = 0 if i not in GLOBAL else block.window_size
    else:
        ref = _model(window_size=0, **ENCODINGS[name])
        ref.load_state_dict(model.state_dict(), strict=True)
    for i in range(len(ref.blocks)):
        if i not in GLOBAL:
            ref.blocks[i] = LoopWindows(ref.blocks[i], WINDOW)
    return ref


def _padded_batch():
    """Two images padded to 40 x 56 px: grids (5, 7) and (4, 4) (the second
    ends inside a patch), neither whole 3 x 3 windows; zeros on padding as
    mmdet pads."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 40, 56, generator=g, dtype=torch.float64)
    mask = torch.zeros(2, 40, 56, dtype=torch.bool)
    mask[1, 29:] = True
    mask[1, :, 30:] = True
    x[mask[:, None].expand_as(x)] = 0
    return x, mask


@pytest.mark.parametrize('name', ENCODINGS)
@pytest.mark.parametrize('padded', [False, True], ids=['whole', 'padded'])
def test_windows_equal_per_window_loop(name, padded):
    model = _model(**ENCODINGS[name])
    assert [b.window_size for b in model.blocks] == [WINDOW, 0, WINDOW]
    ref = _reference(model, name)
    x, mask = _padded_batch()
    if not padded:
        mask = None
    x_ref = x.clone().requires_grad_()
    x = x.requires_grad_()
    outs = model(x, padding_mask=mask)
    refs = ref(x_ref, padding_mask=mask)
    assert outs[0].shape == (2, 16, 5, 7)
    g = torch.Generator().manual_seed(2)
    weights = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
    for out, want in zip(outs, refs):
        torch.testing.assert_close(out, want, atol=_F64_ATOL, rtol=0)
    sum((o * wt).sum() for o, wt in zip(outs, weights)).backward()
    sum((o * wt).sum() for o, wt in zip(refs, weights)).backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=_F64_ATOL, rtol=0)
    ref_params = {
        k.replace('.block.', '.'): p
        for k, p in ref.named_parameters()
    }
    for key, param in model.named_parameters():
        want = ref_params[key].grad
        assert param.grad is not None and want is not None, key
        torch.testing.assert_close(param.grad, want, atol=_F64_ATOL, rtol=0,
                                   msg=key)
    # the windows change the function (the loop is not the global model)
    glob = _model(window_size=0, **ENCODINGS[name])
    glob.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(glob(x, padding_mask=mask)[-1], outs[-1],
                                  atol=1e-3)


@pytest.mark.parametrize('name', ['peg', 'rope-mixed', 'irpe'])
def test_windowed_padded_batch_equals_each_image_alone(name):
    """Windows are anchored at the top-left token: each image of a padded
    batch gets the windows (and the outputs) it gets alone."""
    model = _model(**ENCODINGS[name])
    x, mask = _padded_batch()
    with torch.no_grad():
        outs = model(x, padding_mask=mask)
        for i, (h, w) in enumerate([(40, 56), (29, 30)]):
            alone = model(x[i:i + 1, :, :h, :w])
            ht, wt = -(-h // PATCH), -(-w // PATCH)
            for out, want in zip(outs, alone):
                torch.testing.assert_close(out[i:i + 1, :, :ht, :wt], want,
                                           atol=_F64_ATOL, rtol=0)
                assert (out[i, :, ht:] == 0).all()
                assert (out[i, :, :, wt:] == 0).all()


def _rope_tables_seen(model, x):
    """The ``rope`` argument each block's attention is called with."""
    seen = {}
    hooks = [
        block.attn.register_forward_pre_hook(
            lambda m, args, i=i: seen.__setitem__(i, args[2]))
        for i, block in enumerate(model.blocks)
    ]
    with torch.no_grad():
        model(x)
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize('name', ['rope2d', 'rope-mixed'])
def test_rope_rotation_of_a_token_is_its_full_grid_rotation(name):
    """Each token's cos / sin in a window block (block 0: windows of 3) are
    its entries in the global block's (block 1) full-grid tables."""
    model = _model(**ENCODINGS[name])
    if name == 'rope-mixed':  # one set of frequencies in both blocks
        model.ropes[0].load_state_dict(model.ropes[1].state_dict())
    x = torch.randn(2, 3, 40, 56, dtype=torch.float64)  # grid (5, 7)
    seen = _rope_tables_seen(model, x)
    h, w, s = 5, 7, WINDOW
    nh, nw = 2, 3
    for full, windowed in zip(seen[1], seen[0]):
        full = full if full.dim() == 3 else full[None]  # (H | 1, h*w, D)
        assert windowed.shape == (2 * nh * nw, full.shape[0], s * s,
                                  full.shape[-1])
        for b in range(2):
            for wi in range(nh):
                for wj in range(nw):
                    win = (b * nh + wi) * nw + wj
                    for pr in range(s):
                        for pc in range(s):
                            r, c = wi * s + pr, wj * s + pc
                            got = windowed[win, :, pr * s + pc]
                            if r < h and c < w:
                                want = full[:, r * w + c]
                                torch.testing.assert_close(got, want,
                                                           atol=0, rtol=0)


# ------------------------------------------------------ window_size=0
def _global_model(name, seed=0, **kwargs):
    torch.manual_seed(seed)
    return CPVT(
        arch=SMALL, patch_size=PATCH, img_size=32, out_indices=(0, 2),
        **ENCODINGS[name], **kwargs).double().eval()


def _recorded_input():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 24, 40, generator=g, dtype=torch.float64)
    mask = torch.zeros(2, 24, 40, dtype=torch.bool)
    mask[1, 16:] = True
    x[mask[:, None].expand_as(x)] = 0
    return x, mask


def record_global_outputs(path: str = RECORDED) -> None:
    """The weights (``state``) of the float64 global CPVT for every
    encoding and its last output on :func:`_recorded_input` without
    (``outputs``) and with (``masked``) the padding mask.

    The weights are drawn in float32 by torch's CPU kernels, whose last
    bits depend on the CPU (which compiled variant runs, with or without
    fused multiply-adds), and then cast to float64, so a model initialised
    on another CPU computes outputs ~1e-8 away: the tests load the
    recorded weights and never rely on initialising the same ones. Being
    float32 values, they are stored as float32 (exactly; half the size),
    and equal tensors of different encodings once.
    The outputs were recorded by the CPVT of before windows
    (``PYTHONPATH=<checkout of mmpe before windows> python
    tests/test_models/test_backbones/test_cpvt_windows.py --record``); the
    weights were added later, on a CPU whose initialisation reproduced
    those outputs to 4.4e-16, so they are the weights the outputs were
    computed with."""
    x, mask = _recorded_input()
    record, stored = {}, []

    def once(value):
        for other in stored:
            if other.shape == value.shape and torch.equal(other, value):
                return other
        stored.append(value)
        return value

    for name in RECORDED_ENCODINGS:
        model = _global_model(name)
        state = model.state_dict()
        for key, value in state.items():
            assert torch.equal(value.float().double(), value), key
        with torch.no_grad():
            record[name] = dict(
                state={k: once(v.float()) for k, v in state.items()},
                outputs=model(x)[-1].clone(),
                masked=model(x, padding_mask=mask)[-1].clone())
    torch.save(record, path)


def recorded_global_model(name, **kwargs):
    """The global CPVT of ``name`` (built with ``kwargs``) with the
    recorded weights, and the recording
    (:func:`record_global_outputs`)."""
    record = torch.load(RECORDED, weights_only=True)[name]
    model = _global_model(name, **kwargs)
    model.load_state_dict(record['state'], strict=True)
    return model, record


@pytest.mark.parametrize('name', RECORDED_ENCODINGS)
def test_window_size_zero_is_the_global_backbone(name):
    """Bit for bit: the same state dict and outputs as the model built
    without the new arguments, and (with the recorded weights) the outputs
    recorded from the CPVT of before windows."""
    plain = _global_model(name)
    zero = _global_model(name, window_size=0, global_blocks=(0, 2))
    assert [b.window_size for b in zero.blocks] == [0, 0, 0]
    plain_sd, zero_sd = plain.state_dict(), zero.state_dict()
    assert list(plain_sd) == list(zero_sd)
    for key in plain_sd:
        assert torch.equal(plain_sd[key], zero_sd[key]), key
    plain, record = recorded_global_model(name)
    zero, _ = recorded_global_model(name, window_size=0,
                                    global_blocks=(0, 2))
    assert {k: v.shape for k, v in zero_sd.items()} == \
        {k: v.shape for k, v in record['state'].items()}
    x, mask = _recorded_input()
    with torch.no_grad():
        for pm, key in ((None, 'outputs'), (mask, 'masked')):
            outs, zero_outs = plain(x, padding_mask=pm), zero(
                x, padding_mask=pm)
            for a, b in zip(outs, zero_outs):
                torch.testing.assert_close(a, b, atol=0, rtol=0)
            torch.testing.assert_close(
                zero_outs[-1], record[key], rtol=0,
                atol=RECORDED_RESAMPLED_ATOL if name == 'learnable' else
                RECORDED_ATOL)


@pytest.mark.parametrize('name', RECORDED_ENCODINGS)
def test_global_checkpoints_load_into_windowed_models(name):
    """Windows add no parameter: a checkpoint of the global backbone (the
    recorded weights) loads strictly into a windowed one."""
    state = torch.load(RECORDED, weights_only=True)[name]['state']
    model = _model(**ENCODINGS[name])
    model.load_state_dict(state, strict=True)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key].double()), key


# ------------------------------------------------------------ errors
@pytest.mark.parametrize('kwargs,match', [
    (dict(window_size=-1), r'`window_size` -1.*int >= 0'),
    (dict(window_size=2.0), r'`window_size` 2\.0'),
    (dict(window_size=True), r'`window_size` True'),
    (dict(window_size=4, global_blocks=(3, )),
     r'`global_blocks` entry 3 is out of range.*\[0, 2\]'),
    (dict(window_size=4, global_blocks=(-1, )),
     r'`global_blocks` entry -1 is out of range'),
    (dict(window_size=4, global_blocks=(1, 1)),
     r'`global_blocks` \(1, 1\) repeats block\(s\) \[1\].*\[0, 2\]'),
    (dict(window_size=4, global_blocks='1'), r'`global_blocks`'),
    (dict(window_size=4, use_cls_token=True),
     r'`use_cls_token=True` with `window_size=4`'),
])
def test_bad_window_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CPVT(arch=SMALL, **kwargs)


def test_windows_with_class_token_are_refused_in_the_block():
    from mmpe.models.layers import ViTBlock
    with pytest.raises(ValueError, match='`window_size` 4 with skip=1'):
        ViTBlock(16, 2, window_size=4, skip=1)


# ------------------------------------------------------------ rel-pos
def test_rel_pos_tables_window_and_global_sizes():
    """ViTDet: a window block's tables have ``2 S - 1`` rows, a global
    block's ``2 h0 - 1`` / ``2 w0 - 1`` for ``input_size = (h0, w0)``
    (default: the pre-training grid ``img_size // patch_size``)."""
    head_dim = SMALL['embed_dims'] // SMALL['num_heads']
    for cfg, (h0, w0) in ((None, (4, 4)), (dict(input_size=(6, 5)), (6, 5)),
                          (dict(input_size=7), (7, 7))):
        model = CPVT(arch=SMALL, patch_size=PATCH, img_size=32,
                     pos_encoding='rel-pos', rel_pos_cfg=cfg,
                     window_size=WINDOW, global_blocks=GLOBAL)
        for i, block in enumerate(model.blocks):
            rel = block.attn.rel_pos
            rows = (2 * h0 - 1, 2 * w0 - 1) if i in GLOBAL else (
                2 * WINDOW - 1, 2 * WINDOW - 1)
            assert (rel.table_h.shape, rel.table_w.shape) == (
                (rows[0], head_dim), (rows[1], head_dim)), i
            assert rel.init == 'zeros'  # ViTDet's default
            assert not rel.table_h.any() and not rel.table_w.any()
    # without windows every block is global
    model = CPVT(arch=SMALL, patch_size=PATCH, img_size=32,
                 pos_encoding='rel-pos', rel_pos_cfg=dict(init='trunc_normal'))
    assert {b.attn.rel_pos.table_h.shape[0] for b in model.blocks} == {7}
    assert all(b.attn.rel_pos.table_w.any() for b in model.blocks)


def _interpolate(table, length):
    """ViTDet's resize (``get_rel_pos``): linear, half-pixel centres."""
    return torch.nn.functional.interpolate(
        table.t()[None], size=length, mode='linear',
        align_corners=False)[0].t()


def test_rel_pos_checkpoint_of_other_sizes_loads_resized():
    """A checkpoint whose tables were made for other sizes (e.g. ViTDet's
    64 x 64 global tables, windows of 14) loads strictly into CPVT, each
    table resized linearly to the model's rows; the other weights as they
    are."""
    model = _model(**ENCODINGS['learnable+rel-pos'])
    g = torch.Generator().manual_seed(5)
    state = {k: torch.randn(v.shape, generator=g, dtype=v.dtype)
             for k, v in model.state_dict().items()}
    saved_rows = {0: (9, 9), 1: (13, 7), 2: (4, 4)}  # (table_h, table_w)
    for i, (rh, rw) in saved_rows.items():
        for name, rows in (('table_h', rh), ('table_w', rw)):
            state[f'blocks.{i}.attn.rel_pos.{name}'] = torch.randn(
                rows, 8, generator=g, dtype=torch.float64)
    model.load_state_dict(dict(state), strict=True)
    for key, value in model.state_dict().items():
        if '.rel_pos.' in key:
            # global block 1: input_size (6, 5); window blocks: (3, 3)
            rows = {'blocks.1.attn.rel_pos.table_h': 11,
                    'blocks.1.attn.rel_pos.table_w': 9}.get(key, 5)
            assert value.shape[0] == rows, key
            want = _interpolate(state[key], rows)
            torch.testing.assert_close(value, want, atol=_F64_ATOL, rtol=0,
                                       msg=key)
        else:
            assert torch.equal(value, state[key]), key


@pytest.mark.parametrize('kwargs,match', [
    # two encodings inside attention: the argument, the value, the choices
    (dict(pos_encoding=('irpe', 'rel-pos')),
     r"`pos_encoding` \('irpe', 'rel-pos'\) combines more than one of "
     r"\('rope2d', 'rope-mixed', 'irpe', 'rel-pos', 'log-cpb', 'alibi-2d', "
     r"'lookhere'\)"),
    (dict(pos_encoding=('lookhere', 'rope2d')),
     r'`pos_encoding` .* combines more than one of'),
    (dict(pos_encoding='peg', bias_cfg=dict(hidden=8)),
     r"`bias_cfg` \{'hidden': 8\} is only used with one of \('log-cpb', "
     r"'alibi-2d', 'lookhere'\)"),
    (dict(pos_encoding='log-cpb', bias_cfg=dict(type='log-cpb')),
     r"`bias_cfg` \{'type': 'log-cpb'\}.*the type is the `pos_encoding`"),
    (dict(pos_encoding='alibi-2d', bias_cfg=dict(hidden=8)),
     r"`bias_cfg` arguments \['hidden'\] for type 'alibi-2d'"),
    (dict(pos_encoding='log-cpb', bias_cfg=dict(pretrained_size=1)),
     r'`pretrained_size` 1.*>= 2'),
    (dict(pos_encoding='lookhere', arch=dict(SMALL, num_heads=2)),
     r"LookHere `directions` 'corners' with num_heads=2"),
    (dict(pos_encoding=('rel-pos', 'rope-mixed')),
     r'`pos_encoding` .* combines more than one of'),
    (dict(pos_encoding='peg', rel_pos_cfg=dict(input_size=4)),
     r"`rel_pos_cfg` \{'input_size': 4\} is only used with 'rel-pos'.*"
     r"pos_encoding=\('peg',\)"),
    (dict(pos_encoding='rel-pos', rel_pos_cfg=dict(input_size=4, size=2)),
     r"`rel_pos_cfg` keys \['size'\] are not used, please choose from "
     r"\('input_size', 'init'\)"),
    (dict(pos_encoding='rel-pos', rel_pos_cfg='zeros'),
     r"`rel_pos_cfg` 'zeros'.*\('input_size', 'init'\)"),
    (dict(pos_encoding='rel-pos', rel_pos_cfg=dict(input_size=(4, 0))),
     r'`input_size` \(4, 0\).*int > 0'),
    (dict(pos_encoding='rel-pos', rel_pos_cfg=dict(init='normal')),
     r"`init` 'normal'.*\('zeros', 'trunc_normal'\)"),
    (dict(pos_encoding=('learnable', 'rel-pos'), use_cls_token=True),
     r"`use_cls_token=True` with 'rel-pos'.*use_cls_token=False"),
])
def test_bad_rel_pos_and_bias_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CPVT(**dict(dict(arch=SMALL), **kwargs))


if __name__ == '__main__' and sys.argv[1:] == ['--record']:
    record_global_outputs()
