"""mmpe/models/layers/encodings/table_resample.py: a table resampled to each
image's grid by per-axis weight matrices, against PyTorch's
``F.interpolate`` (DINOv2's ``interpolate_pos_encoding`` calls it with a
scale factor, or an output size with antialias)."""
import pytest
import torch
import torch.nn.functional as F

from mmpe.models.layers.encodings.pos_embed_2d import resample_pos_embed
from mmpe.models.layers.encodings.table_resample import (
    aa_bicubic_matrix, bicubic_matrix, resample_table_per_image)

# float64 on both sides: the same sums in another order
_F64_ATOL = 1e-12
GRIDS = [(20, 25), (37, 40), (73, 91), (5, 60)]  # down, near, up, mixed


def _interpolate(table, hw, antialias, offset):
    """DINOv2's call: scale factors ``(n + offset) / M`` with an offset,
    else the output size."""
    grid = table[None]
    if offset:
        scale = tuple((n + offset) / m for n, m in zip(hw, table.shape[1:]))
        return F.interpolate(grid, scale_factor=scale, mode='bicubic',
                             antialias=antialias)[0]
    return F.interpolate(grid, size=hw, mode='bicubic',
                         antialias=antialias)[0]


def _resampled(table, hw, extent=None, **kwargs):
    out = resample_table_per_image(table, hw, extent, **kwargs)
    return out.reshape(out.shape[0], *hw, -1).permute(0, 3, 1, 2)


@pytest.mark.parametrize('antialias, offset', [(False, 0.1), (True, 0.),
                                               (False, 0.), (True, 0.1)])
@pytest.mark.parametrize('hw', GRIDS)
def test_equals_pytorchs_interpolate(antialias, offset, hw):
    table = torch.randn(3, 37, 37, dtype=torch.float64)
    got = _resampled(table, hw, antialias=antialias, offset=offset)[0]
    want = _interpolate(table, hw, antialias, offset)
    assert want.shape[1:] == hw  # the offset keeps DINOv2's output size
    torch.testing.assert_close(got, want, atol=_F64_ATOL, rtol=0)


@pytest.mark.parametrize('antialias', [False, True])
def test_the_tables_own_grid_is_the_table_also_with_the_offset(antialias):
    """DINOv2 returns its table unchanged for an input of its grid, where
    the plain bicubic's offset would resample it (the control: it differs
    from the table; PyTorch's antialiased resize leaves an axis of
    unchanged length alone)."""
    table = torch.randn(4, 37, 37, dtype=torch.float64)
    got = _resampled(table, (37, 37), antialias=antialias, offset=0.1)[0]
    assert torch.equal(got, table)
    moved = _interpolate(table, (37, 37), antialias, 0.1)
    assert ((moved - table).abs().max() > 1e-3) == (not antialias)


def test_each_image_gets_its_own_extents_table():
    """A padded (40, 50) grid, images of extents (20, 25), (40, 50),
    (37, 37): each image's valid part is its table alone."""
    table = torch.randn(2, 37, 37, dtype=torch.float64)
    extent = torch.tensor([[20, 25], [40, 50], [37, 37]])
    out = _resampled(table, (40, 50), extent, antialias=False, offset=0.1)
    for b, (h, w) in enumerate(extent.tolist()):
        alone = _resampled(table, (h, w), antialias=False, offset=0.1)[0]
        torch.testing.assert_close(out[b, :, :h, :w], alone, atol=_F64_ATOL,
                                   rtol=0)


def test_weights_sum_to_one_and_rows_past_the_source_are_zero():
    """Within the source each output's weights sum to 1 (clamped taps add
    up at the border); the antialiased rows of a padded grid past an
    image's extent are 0, never NaN."""
    ratio = torch.tensor([37 / 20.1, 37 / 73.1], dtype=torch.float64)
    inside = [20, 73]
    for matrix in (bicubic_matrix, aa_bicubic_matrix):
        mat = matrix(37, 80, ratio)
        assert torch.isfinite(mat).all()
        for b, n in enumerate(inside):
            torch.testing.assert_close(
                mat[b, :n].sum(-1), torch.ones(n, dtype=mat.dtype),
                atol=_F64_ATOL, rtol=0)
    assert aa_bicubic_matrix(37, 80, ratio)[0, 40:].abs().max() == 0


def test_resample_pos_embed_per_image_keeps_the_class_row():
    """``per_image``: (B, 1 + h * w, C), the class row repeated per image;
    without an extent one image."""
    table = torch.randn(1, 1 + 37 * 37, 8)
    out = resample_pos_embed(table, (37, 37), (20, 30), num_skip=1,
                             per_image=True, offset=0.1,
                             extent=torch.tensor([[20, 30], [10, 12]]))
    assert out.shape == (2, 1 + 600, 8)
    assert torch.equal(out[:, 0], table[:, 0].expand(2, -1))
    one = resample_pos_embed(table, (37, 37), (20, 30), num_skip=1,
                             per_image=True, offset=0.1)
    assert one.shape == (1, 601, 8)
    torch.testing.assert_close(one[0], out[0], atol=0, rtol=0)
