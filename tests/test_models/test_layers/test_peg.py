"""PEG against an explicit depth-wise convolution written with loops."""
import pytest
import torch

from mmpe.models.layers import PEG

_F64_ATOL = 1e-10  # float64, only summation order differs


def peg_reference(peg: PEG, tokens: torch.Tensor, hw, num_skip: int,
                  valid=None) -> torch.Tensor:
    """Loop over batch, channel, output position and kernel tap.

    ``valid`` (h, w) bool per image, or None; padded inputs read as zero and
    padded outputs are zero.
    """
    h, w = hw
    b, _, c = tokens.shape
    k, s = peg.kernel_size, peg.stride
    r = k // 2
    weight = peg.proj.weight.detach()  # (C, 1, k, k)
    bias = peg.proj.bias.detach()
    grid = tokens[:, num_skip:].reshape(b, h, w, c)
    ho, wo = -(-h // s), -(-w // s)
    out = torch.zeros(b, ho, wo, c, dtype=tokens.dtype)
    for n in range(b):
        for ch in range(c):
            for i in range(ho):
                for j in range(wo):
                    yc, xc = i * s, j * s
                    if valid is not None and not valid[n][yc, xc]:
                        continue  # padded output stays zero
                    acc = bias[ch].item()
                    for di in range(k):
                        for dj in range(k):
                            y, x = yc + di - r, xc + dj - r
                            if not (0 <= y < h and 0 <= x < w):
                                continue  # zero padding
                            if valid is not None and not valid[n][y, x]:
                                continue  # padded token read as zero
                            acc += weight[ch, 0, di, dj].item() * \
                                grid[n, y, x, ch].item()
                    if s == 1:
                        acc += grid[n, yc, xc, ch].item()
                    out[n, i, j, ch] = acc
    return torch.cat([tokens[:, :num_skip], out.reshape(b, ho * wo, c)], 1)


def _peg(c, k=3, s=1):
    torch.manual_seed(0)
    peg = PEG(c, kernel_size=k, stride=s).double()
    with torch.no_grad():  # non-trivial bias so the padding rule shows
        peg.proj.bias.normal_()
    return peg


@pytest.mark.parametrize('k', [1, 3, 5])
@pytest.mark.parametrize('s', [1, 2])
@pytest.mark.parametrize('num_skip', [0, 1, 2])
@pytest.mark.parametrize('hw', [(4, 5), (1, 6), (3, 1)])
def test_peg_matches_loop_reference(k, s, num_skip, hw):
    c = 3
    peg = _peg(c, k, s)
    tokens = torch.randn(2, num_skip + hw[0] * hw[1], c, dtype=torch.float64)
    out = peg(tokens, hw, num_skip=num_skip)
    ho, wo = peg.output_shape(hw)
    assert out.shape == (2, num_skip + ho * wo, c)
    ref = peg_reference(peg, tokens, hw, num_skip)
    torch.testing.assert_close(out, ref, atol=_F64_ATOL, rtol=0)


@pytest.mark.parametrize('s', [1, 2])
def test_peg_masked_matches_loop_reference(s):
    c, hw = 2, (5, 6)
    peg = _peg(c, 3, s)
    tokens = torch.randn(2, 1 + 30, c, dtype=torch.float64)
    valid = torch.zeros(2, *hw, dtype=torch.bool)
    valid[0, :3, :4] = True
    valid[1, :5, :2] = True
    out = peg(tokens, hw, padding_mask=~valid, num_skip=1)
    ref = peg_reference(peg, tokens, hw, 1, valid=valid)
    torch.testing.assert_close(out, ref, atol=_F64_ATOL, rtol=0)


@pytest.mark.parametrize('k', [3, 5])
@pytest.mark.parametrize('shift', [(1, 2), (-2, 1), (0, -3)])
def test_peg_translation_equivariance_interior(k, shift):
    """Shifting the input shifts the output, away from the zero border."""
    c, h, w = 4, 12, 13
    r = k // 2
    peg = _peg(c, k)
    grid = torch.randn(1, h, w, c, dtype=torch.float64)
    moved = torch.roll(grid, shifts=shift, dims=(1, 2))
    out = peg(grid.reshape(1, h * w, c), (h, w)).reshape(1, h, w, c)
    out_moved = peg(moved.reshape(1, h * w, c), (h, w)).reshape(1, h, w, c)
    dy, dx = shift
    # both the source window and the shifted window stay inside the grid
    # and clear of the wrapped-around rows/columns
    ys = [y for y in range(h) if r + abs(dy) <= y < h - r - abs(dy)]
    xs = [x for x in range(w) if r + abs(dx) <= x < w - r - abs(dx)]
    assert ys and xs
    for y in ys:
        for x in xs:
            torch.testing.assert_close(
                out_moved[0, y + dy, x + dx], out[0, y, x],
                atol=_F64_ATOL, rtol=0)


@pytest.mark.parametrize('num_skip', [0, 1])
@pytest.mark.parametrize('valid_hw', [(3, 4), (5, 2), (1, 1), (6, 7)])
def test_peg_padded_batch_equals_single_image(num_skip, valid_hw):
    """Garbage in the padding never reaches the valid region."""
    c, hw = 3, (6, 7)
    peg = _peg(c)
    hv, wv = valid_hw
    single = torch.randn(1, num_skip + hv * wv, c, dtype=torch.float64)
    out_single = peg(single, valid_hw, num_skip=num_skip)

    grid = torch.randn(2, *hw, c, dtype=torch.float64) * 10  # garbage
    grid[0, :hv, :wv] = single[0, num_skip:].reshape(hv, wv, c)
    skip = torch.cat([single[:, :num_skip], single[:, :num_skip]], 0)
    batch = torch.cat([skip, grid.reshape(2, -1, c)], 1)
    mask = torch.ones(2, *hw, dtype=torch.bool)
    mask[0, :hv, :wv] = False
    mask[1] = False  # second image fills the batch
    out = peg(batch, hw, padding_mask=mask, num_skip=num_skip)

    out_grid = out[0, num_skip:].reshape(*hw, c)
    torch.testing.assert_close(
        out_grid[:hv, :wv],
        out_single[0, num_skip:].reshape(hv, wv, c),
        atol=_F64_ATOL,
        rtol=0)
    assert (out_grid[mask[0]] == 0).all()
    # the unpadded image of the batch is unaffected by the mask argument
    torch.testing.assert_close(
        out[1],
        peg(batch[1:], hw, num_skip=num_skip)[0],
        atol=_F64_ATOL,
        rtol=0)


@pytest.mark.parametrize('num_skip', [1, 2])
def test_peg_skip_tokens_untouched(num_skip):
    c, hw = 3, (3, 3)
    peg = _peg(c)
    tokens = torch.randn(2, num_skip + 9, c, dtype=torch.float64,
                         requires_grad=True)
    out = peg(tokens, hw, num_skip=num_skip)
    assert torch.equal(out[:, :num_skip], tokens[:, :num_skip])
    # the skip tokens' gradient is the identity: nothing else reads them
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.testing.assert_close(tokens.grad[:, :num_skip],
                               grad[:, :num_skip])


@pytest.mark.parametrize('s', [1, 2])
def test_peg_gradcheck(s):
    c, hw = 2, (3, 4)
    peg = _peg(c, 3, s)
    tokens = torch.randn(2, 1 + 12, c, dtype=torch.float64,
                         requires_grad=True)
    mask = torch.zeros(2, *hw, dtype=torch.bool)
    mask[0, 2:] = True
    assert torch.autograd.gradcheck(
        lambda t: peg(t, hw, padding_mask=mask, num_skip=1), (tokens, ))
    out = peg(tokens, hw, padding_mask=mask, num_skip=1)
    out.square().sum().backward()
    assert peg.proj.weight.grad is not None
    assert torch.isfinite(peg.proj.weight.grad).all()


def test_peg_bad_arguments():
    with pytest.raises(ValueError, match='kernel_size'):
        PEG(8, kernel_size=2)
    with pytest.raises(ValueError, match='kernel_size'):
        PEG(8, kernel_size=0)
    with pytest.raises(ValueError, match='stride'):
        PEG(8, stride=0)
    with pytest.raises(ValueError, match='embed_dims'):
        PEG(0)
    peg = PEG(4)
    with pytest.raises(ValueError, match='h \\* w'):
        peg(torch.randn(1, 10, 4), (3, 3))
    with pytest.raises(ValueError, match='padding_mask'):
        peg(torch.randn(1, 9, 4), (3, 3),
            padding_mask=torch.zeros(1, 9, dtype=torch.bool))


def test_peg_registered():
    from mmdet.registry import MODELS
    peg = MODELS.build(dict(type='PEG', embed_dims=4, kernel_size=5))
    assert isinstance(peg, PEG) and peg.kernel_size == 5
