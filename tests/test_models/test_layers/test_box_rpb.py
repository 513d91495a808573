"""BoxRPB (Lin et al., ICCV 2023, Sec. 3.2) as a relative term of mmpe's
attention core: cross-attention of Q queries against an (h, w) key grid.

The expected values come from a per-pair loop written from the paper's
equations in this file: for each image, head, query and key the pixel
offsets of the reference box (or point) to the key's pixel centre, the two
MLPs applied to them (plain ``relu(x W1^T + b1) W2^T``), their sum added
to ``q . k / sqrt(d)``, the padded keys left out of the softmax. Its
gradients (autograd through the loop) are those of the equations.
"""
import math

import pytest
import torch

from mmpe.models.layers import AxisBiasTerm, BoxRPB, CrossPEAttention
from mmpe.models.layers.box.box_rpb import valid_extent

# float64 everywhere: the loop and the core sum in other orders
_F64_TOL = dict(atol=1e-10, rtol=1e-9)
# SDPA's kernel in float64: another summation order of the same sums
_SDPA_TOL = dict(atol=1e-9, rtol=1e-8)

HEADS, DIM, QUERIES = 2, 4, 5
GRID = (3, 4)
STRIDE = 16.0
# image 0 fills the grid; image 1 is 2 x 3 cells (bottom row, right column
# padded)
VALID = ((3, 4), (2, 3))


def _mask():
    h, w = GRID
    mask = torch.zeros(len(VALID), h, w, dtype=torch.bool)
    for i, (vh, vw) in enumerate(VALID):
        mask[i, vh:] = True
        mask[i, :, vw:] = True
    return mask.flatten(1)  # (B, h * w)


def _inputs(mode, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, (h, w) = len(VALID), GRID
    q = torch.randn(b, HEADS, QUERIES, DIM, generator=g, dtype=torch.float64)
    k = torch.randn(b, HEADS, h * w, DIM, generator=g, dtype=torch.float64)
    v = torch.randn(b, HEADS, h * w, DIM, generator=g, dtype=torch.float64)
    if mode == 'box':
        refs = torch.cat([
            torch.rand(b, QUERIES, 2, generator=g, dtype=torch.float64),
            0.1 + 0.5 * torch.rand(
                b, QUERIES, 2, generator=g, dtype=torch.float64)
        ], -1)
    else:
        refs = torch.rand(b, QUERIES, 2, generator=g, dtype=torch.float64)
    return [x.requires_grad_() for x in (q, k, v, refs)]


def _rpb(mode, offsets, seed=0):
    torch.manual_seed(seed)
    rpb = BoxRPB(HEADS, mode=mode, hidden=8, offsets=offsets,
                 stride=STRIDE).double()
    # weights large enough that the bias moves the softmax
    for p in rpb.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return rpb


def _mlp(mlp, x):
    """``relu(x W1^T + b1) W2^T`` of one offset vector (in,) -> (heads,)."""
    w1, b1, w2 = mlp[0].weight, mlp[0].bias, mlp[2].weight
    return torch.relu(w1 @ x + b1) @ w2.t()


def _phi(d, offsets):
    if offsets == 'linear':
        return d
    return torch.sign(d) * torch.log2(d.abs() + 1) / math.log2(8)


def _loop_bias(rpb, refs, mode, offsets):
    """B[b, head, q, jy * w + jx] pair by pair from the equations."""
    h, w = GRID
    rows = []
    for b, (vh, vw) in enumerate(VALID):
        per_q = []
        for qi in range(QUERIES):
            r = refs[b, qi]
            if mode == 'box':
                xs = torch.stack([r[0] - r[2] / 2, r[0] + r[2] / 2]) * vw
                ys = torch.stack([r[1] - r[3] / 2, r[1] + r[3] / 2]) * vh
            else:
                xs, ys = r[0:1] * vw, r[1:2] * vh
            xs, ys = xs * STRIDE, ys * STRIDE  # pixels
            pairs = []
            for jy in range(h):
                for jx in range(w):
                    px, py = (jx + 0.5) * STRIDE, (jy + 0.5) * STRIDE
                    pairs.append(
                        _mlp(rpb.mlp_x, _phi(xs - px, offsets)) +
                        _mlp(rpb.mlp_y, _phi(ys - py, offsets)))
            per_q.append(torch.stack(pairs, -1))  # (heads, h * w)
        rows.append(torch.stack(per_q, 1))  # (heads, Q, h * w)
    return torch.stack(rows)


def _loop_attention(q, k, v, bias, mask):
    """softmax over the valid keys of q . k / sqrt(d) + bias, then @ v."""
    b_, heads, nq, d = q.shape
    outs = []
    for b in range(b_):
        keep = (~mask[b]).nonzero().flatten()
        per_h = []
        for hd in range(heads):
            per_q = []
            for qi in range(nq):
                logits = torch.stack([
                    q[b, hd, qi] @ k[b, hd, j] / math.sqrt(d) +
                    bias[b, hd, qi, j] for j in keep.tolist()
                ])
                p = torch.softmax(logits, 0)
                per_q.append(p @ v[b, hd, keep])
            per_h.append(torch.stack(per_q))
        outs.append(torch.stack(per_h))
    return torch.stack(outs)


@pytest.mark.parametrize('offsets', ['linear', 'log8'])
@pytest.mark.parametrize('mode', ['box', 'point'])
def test_bias_equals_per_pair_loop(mode, offsets):
    rpb = _rpb(mode, offsets)
    *_, refs = _inputs(mode)
    mask = _mask()
    got = rpb(refs, mask, *GRID)
    want = _loop_bias(rpb, refs, mode, offsets)
    assert got.shape == (len(VALID), HEADS, QUERIES, GRID[0] * GRID[1])
    torch.testing.assert_close(got, want, **_F64_TOL)


def test_valid_extent_reads_the_mask():
    ext = valid_extent(_mask(), *GRID, torch.zeros(1, dtype=torch.float64))
    assert ext.tolist() == [list(map(float, s)) for s in VALID]
    none = valid_extent(None, *GRID, torch.zeros(1))
    assert none.tolist() == [[3.0, 4.0]]


@pytest.mark.parametrize('impl,chunk', [('explicit', None), ('chunked', 2),
                                        ('chunked', 3), ('auto', None)])
@pytest.mark.parametrize('offsets', ['linear', 'log8'])
@pytest.mark.parametrize('mode', ['box', 'point'])
def test_attention_with_bias_forward_backward(mode, offsets, impl, chunk):
    """Forward and gradients w.r.t. q, k, v, the references and the MLP
    weights against the loop; chunks of 2 and 3 rows do not divide Q = 5."""
    rpb = _rpb(mode, offsets)
    core = CrossPEAttention(HEADS * DIM, HEADS, attn_impl=impl,
                            chunk_size=chunk)
    mask = _mask()
    inputs = _inputs(mode)
    q, k, v, refs = inputs
    term = rpb.term(refs, mask, *GRID)
    assert isinstance(term, AxisBiasTerm)
    got = core.attend(q, k, v, GRID, mask, terms=[term])
    params = list(rpb.parameters())
    grad_out = torch.randn_like(got)
    grads = torch.autograd.grad(got, inputs + params, grad_out)

    want = _loop_attention(q, k, v, _loop_bias(rpb, refs, mode, offsets),
                           mask)
    want_grads = torch.autograd.grad(want, inputs + params, grad_out)
    torch.testing.assert_close(got, want, **_F64_TOL)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, **_F64_TOL)
    # the MLPs do get gradients
    assert all(torch.count_nonzero(g) > 0 for g in grads[4:])


@pytest.mark.parametrize('mode', ['box', 'point'])
def test_inference_takes_sdpa_with_the_bias_as_mask(mode):
    rpb = _rpb(mode, 'log8')
    core = CrossPEAttention(HEADS * DIM, HEADS)
    mask = _mask()
    q, k, v, refs = (x.detach() for x in _inputs(mode))
    with torch.no_grad():
        assert core.select_backend(QUERIES, False) == 'sdpa'
        got = core.attend(q, k, v, GRID, mask,
                          terms=[rpb.term(refs, mask, *GRID)])
        want = _loop_attention(q, k, v, _loop_bias(rpb, refs, mode, 'log8'),
                               mask)
    torch.testing.assert_close(got, want, **_SDPA_TOL)


def test_chunked_keeps_no_query_by_key_tensor_for_backward():
    """The chunked backend saves q, k, v, the output and the per-axis
    values, never a (B, H, Q, h * w) tensor."""
    rpb = _rpb('box', 'linear')
    core = CrossPEAttention(HEADS * DIM, HEADS, attn_impl='chunked',
                            chunk_size=2)
    q, k, v, refs = _inputs('box')
    mask = _mask()
    saved = []

    def pack(x):
        saved.append(tuple(x.shape))
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        core.attend(q, k, v, GRID, mask,
                    terms=[rpb.term(refs, mask, *GRID)])
    full = (len(VALID), HEADS, QUERIES, GRID[0] * GRID[1])
    assert saved and full not in saved


def test_bad_arguments_name_the_choices():
    with pytest.raises(ValueError,
                       match=r"`mode` 'boxes'.*\('box', 'point'\)"):
        BoxRPB(2, mode='boxes')
    with pytest.raises(ValueError, match=r"`offsets` 'log'.*'linear', 'log8'"):
        BoxRPB(2, offsets='log')
    with pytest.raises(ValueError, match='`hidden` 0'):
        BoxRPB(2, hidden=0)
    with pytest.raises(ValueError, match='`stride` -1'):
        BoxRPB(2, stride=-1)
    with pytest.raises(ValueError, match=r"`attn_impl` 'flex'.*'chunked'"):
        CrossPEAttention(8, 2, attn_impl='flex')
    rpb = BoxRPB(2, mode='box')
    with pytest.raises(ValueError, match=r"mode='point'"):
        rpb.term(torch.rand(1, 3, 2), None, 2, 2)
    core = CrossPEAttention(8, 2)
    q = torch.randn(1, 2, 3, 4)
    k = torch.randn(1, 2, 6, 4)
    with pytest.raises(ValueError, match=r'\(2, 2\) means 4 keys.*6'):
        core.attend(q, k, k, (2, 2))
