"""``bicubic_resize`` (the gathers behind ``pos_embed_interp='detectron2'``)
against PyTorch's ``F.interpolate(mode='bicubic', align_corners=False)``
without antialias (detectron2's ``get_abs_pos``): enlarging, shrinking,
non-square, one-sample sources, the identity; values and gradients."""
import pytest
import torch
import torch.nn.functional as F

from mmpe.models.layers.encodings.pos_embed_2d import bicubic_resize

# float64: the kernel's weights and sums in another order (16 taps)
_F64_ATOL = 1e-13
_F32_ATOL = 2e-5  # float32, the same


@pytest.mark.parametrize('src, dst', [((7, 7), (10, 13)), ((14, 14), (64, 64)),
                                      ((14, 14), (5, 9)), ((7, 5), (7, 5)),
                                      ((1, 3), (4, 2)), ((6, 9), (3, 30))])
@pytest.mark.parametrize('dtype, atol', [(torch.float64, _F64_ATOL),
                                         (torch.float32, _F32_ATOL)])
def test_bicubic_resize_is_torch_bicubic(src, dst, dtype, atol):
    g = torch.Generator().manual_seed(0)
    grid = torch.randn(2, 5, *src, generator=g, dtype=dtype)
    want = F.interpolate(grid, size=dst, mode='bicubic', align_corners=False)
    got = bicubic_resize(grid, dst)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, atol=atol, rtol=0)


def test_bicubic_resize_gradient_is_torch_bicubic():
    g = torch.Generator().manual_seed(1)
    grid = torch.randn(1, 3, 7, 7, generator=g, dtype=torch.float64)
    weight = torch.randn(1, 3, 10, 13, generator=g, dtype=torch.float64)
    grads = []
    for fn in (lambda t: bicubic_resize(t, (10, 13)),
               lambda t: F.interpolate(t, size=(10, 13), mode='bicubic',
                                       align_corners=False)):
        t = grid.clone().requires_grad_()
        (fn(t) * weight).sum().backward()
        grads.append(t.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=_F64_ATOL, rtol=0)
