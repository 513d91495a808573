"""Non-overlapping windows on a token grid (ViTDet's window attention).

Reference: Li et al., "Exploring Plain Vision Transformer Backbones for
Object Detection" (ViTDet), ECCV 2022, Sec. 3 "Backbone adaptation": most
blocks attend inside non-overlapping ``S x S`` windows, a few stay global.
The grid ``(h, w)`` is padded bottom/right to ``(nh * S, nw * S)`` with
``nh = ceil(h / S)``, ``nw = ceil(w / S)``; window ``(i, j)`` holds the
tokens of rows ``i S .. i S + S - 1`` and columns ``j S .. j S + S - 1``.
Windows are anchored at the top-left token, as mmdet's batch padding is
bottom/right, so an image of a padded batch gets the windows it gets alone.

Pure functions, one place for the layout: tokens in and out of windows, the
key mask of the windows and per-token tables (RoPE ``cos`` / ``sin``) cut
like the tokens.

The tokens that pad the grid to whole windows are zeros (the block pads its
normed tokens). :data:`WINDOW_PADDINGS` says what attention makes of them:
``'masked'`` (mmpe's default): they are masked keys, so a window at the edge
of the grid attends only among its tokens inside the grid; ``'zeros'``
(detectron2's ViTDet, ``window_partition``): they are keys like any other,
zero tokens at their place in the ``S x S`` window, so every query of an edge
window also attends to them (their keys and values are the projections'
biases). Sizes travel as the tensors
give them (symbolic while a graph is traced); nothing here reads tensor
values.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common.tracing import is_tracing

#: What attention makes of the tokens that pad the grid to whole windows:
#: masked keys (``'masked'``) or zero tokens attended to (``'zeros'``,
#: detectron2's ViTDet).
WINDOW_PADDINGS = ('masked', 'zeros')


def window_grid(hw_shape: Tuple[int, int],
                window_size: int) -> Tuple[int, int]:
    """Windows per column and per row ``(nh, nw)``: ``ceil(h / S)``,
    ``ceil(w / S)``."""
    h, w = hw_shape
    return (h + window_size - 1) // window_size, \
        (w + window_size - 1) // window_size


def partition_grid(x: Tensor, window_size: int) -> Tensor:
    """``(N, h, w, C)`` -> ``(N * nh * nw, S * S, C)``, zeros past the grid.

    Window order is ``N``-major, then window rows, then window columns;
    tokens inside a window are row-major.
    """
    n, h, w, c = x.shape
    s = window_size
    nh, nw = window_grid((h, w), s)
    # bottom/right zero padding to (nh * S, nw * S)
    x = F.pad(x, (0, 0, 0, nw * s - w, 0, nh * s - h))
    # (N, nh, S, nw, S, C) -> (N, nh, nw, S, S, C) -> (N*nh*nw, S*S, C)
    x = x.reshape(n, nh, s, nw, s, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n * nh * nw, s * s, c)


def unpartition_grid(windows: Tensor, hw_shape: Tuple[int, int],
                     window_size: int) -> Tensor:
    """Inverse of :func:`partition_grid`: ``(N * nh * nw, S * S, C)`` ->
    ``(N, h, w, C)``, the padding cropped."""
    x = merge_windows(windows, hw_shape, window_size)
    # (N, h*w, C) -> (N, h, w, C)
    return x.reshape(x.shape[0], hw_shape[0], hw_shape[1], x.shape[-1])


def window_tokens(x: Tensor, hw_shape: Tuple[int, int],
                  window_size: int) -> Tensor:
    """Grid tokens ``(B, h * w, C)`` -> windows ``(B * nh * nw, S * S, C)``
    (padded tokens are zeros)."""
    b, _, c = x.shape
    h, w = hw_shape
    # (B, h*w, C) -> (B, h, w, C)
    return partition_grid(x.reshape(b, h, w, c), window_size)


def merge_windows(windows: Tensor, hw_shape: Tuple[int, int],
                  window_size: int) -> Tensor:
    """Windows ``(B * nh * nw, S * S, C)`` -> grid tokens ``(B, h * w, C)``
    (inverse of :func:`window_tokens`, the padding cropped)."""
    h, w = hw_shape
    s = window_size
    nh, nw = window_grid(hw_shape, s)
    c = windows.shape[-1]
    # (B*nh*nw, S*S, C) -> (B, nh, nw, S, S, C) -> (B, nh, S, nw, S, C)
    x = windows.reshape(-1, nh, nw, s, s, c).permute(0, 1, 3, 2, 4, 5)
    # -> (B, nh*S * nw*S, C), row-major over the padded grid
    x = x.reshape(x.shape[0], -1, c)
    # the grid's tokens by index, not by a slice of the padded grid: a
    # slice's layout depends on whether anything was cropped, and a traced
    # graph would guard on whether the grid is whole windows
    rows = torch.arange(h, device=x.device)
    cols = torch.arange(w, device=x.device)
    index = (rows[:, None] * (nw * s) + cols[None, :]).flatten()
    return x.index_select(1, index)


def window_key_mask(key_padding_mask: Optional[Tensor],
                    batch: int,
                    hw_shape: Tuple[int, int],
                    window_size: int,
                    device: torch.device,
                    padding: str = 'masked') -> Optional[Tensor]:
    """Key mask of the windows ``(B * nh * nw, S * S)``, True on padding.

    Masked are the tokens the grid's own mask marks (the padding of a
    padded batch) and, with ``padding='masked'``, the tokens that pad the
    grid to whole windows (with ``'zeros'`` those stay keys: detectron2's
    ViTDet attends to them as zero tokens). A window
    with no unmasked token (all padding of a smaller image in the batch) is
    left unmasked instead: its queries are padded tokens whose outputs no
    valid token reads (they are masked keys everywhere and cropped or
    zeroed at the end), and a fully masked softmax row would be NaN, which
    would reach the valid tokens through ``0 * NaN`` in later blocks.

    Args:
        key_padding_mask (Tensor, optional): ``(B, h * w)`` bool, True on
            padded grid tokens. None: nothing padded.
        batch (int): B.
        hw_shape (tuple[int, int]): The grid ``(h, w)``.
        window_size (int): S.
        device (torch.device): Device of the mask built here.
        padding (str): One of :data:`WINDOW_PADDINGS`. Defaults to
            'masked'.

    Returns:
        Tensor | None: ``(B * nh * nw, S * S)`` bool; None in eager mode
        when nothing is masked (no mask was given and, for ``'masked'``,
        the grid is whole windows). While tracing a ``'masked'`` mask is
        always returned, so one graph serves every grid; ``'zeros'``
        without a mask gives None for every grid.
    """
    if padding == 'zeros':
        return _batch_padding_key_mask(key_padding_mask, batch, hw_shape,
                                       window_size)
    if padding != 'masked':
        raise ValueError(f'Unsupported window `padding` {padding!r}, please '
                         f'choose from {WINDOW_PADDINGS}')
    h, w = hw_shape
    s = window_size
    nh, nw = window_grid(hw_shape, s)
    if key_padding_mask is None and not is_tracing() and (h % s == 0
                                                          and w % s == 0):
        return None
    # (nh*S, nw*S): True past the grid
    rows = torch.arange(nh * s, device=device) >= h
    cols = torch.arange(nw * s, device=device) >= w
    outside = (rows[:, None] | cols[None, :]).expand(batch, -1, -1)
    if key_padding_mask is not None:
        inside = F.pad(
            key_padding_mask.reshape(batch, h, w),
            (0, nw * s - w, 0, nh * s - h), value=True)
        outside = outside | inside
    # (B, nh*S, nw*S, 1) -> (B*nh*nw, S*S)
    mask = partition_grid(outside[..., None], s)[..., 0]
    return mask & ~mask.all(dim=-1, keepdim=True)


def _batch_padding_key_mask(key_padding_mask: Optional[Tensor], batch: int,
                            hw_shape: Tuple[int, int],
                            window_size: int) -> Optional[Tensor]:
    """:func:`window_key_mask` with ``padding='zeros'``: the batch padding
    masked, the window padding not; None without a mask."""
    if key_padding_mask is None:
        return None
    h, w = hw_shape
    s = window_size
    nh, nw = window_grid(hw_shape, s)
    # (B, nh*S, nw*S): the window padding stays a key (False)
    inside = F.pad(
        key_padding_mask.reshape(batch, h, w),
        (0, nw * s - w, 0, nh * s - h), value=False)
    mask = partition_grid(inside[..., None], s)[..., 0]
    return mask & ~mask.all(dim=-1, keepdim=True)


def window_table(table: Tensor,
                 batch: int,
                 hw_shape: Tuple[int, int],
                 window_size: int,
                 batched: Optional[bool] = None) -> Tensor:
    """A per-token table (RoPE ``cos`` or ``sin``) cut into the windows, so
    that each token keeps its entry of the full grid.

    Args:
        table (Tensor): ``(h * w, D)``, ``(H, h * w, D)`` (per head),
            ``(B, h * w, D)`` (per image) or ``(B | 1, H | 1, h * w, D)``.
        batch (int): B, the images of the windowed tokens.
        hw_shape (tuple[int, int]): The grid ``(h, w)``.
        window_size (int): S.
        batched (bool, optional): Whether the first dim of a 3-dim table is
            the batch (``(B, h * w, D)``) rather than heads. None: as
            :func:`~mmpe.models.layers.apply_rope2d` broadcasts a table
            against ``(B, H, L, D)`` (3 dims are heads, 4 dims batch and
            heads). Defaults to None.

    Returns:
        Tensor: ``(B * nh * nw, H | 1, S * S, D)``, in the window order of
        :func:`window_tokens`; entries past the grid are zeros.
    """
    h, w = hw_shape
    d = table.shape[-1]
    # -> (B | 1, H | 1, h*w, D)
    if table.dim() == 2:
        table = table[None, None]
    elif table.dim() == 3:
        table = table[:, None] if batched else table[None]
    elif table.dim() != 4:
        raise ValueError(f'window_table: a table of shape '
                         f'{tuple(table.shape)}; expected (L, D), (H, L, D), '
                         '(B, L, D) or (B, H, L, D)')
    tb, th = table.shape[0], table.shape[1]
    # (tb, th, h*w, D) -> (tb*th, h, w, D) -> (tb*th*nW, S*S, D)
    windows = partition_grid(table.reshape(tb * th, h, w, d), window_size)
    nh, nw = window_grid(hw_shape, window_size)
    # (tb, th, nW, S*S, D) -> (tb, nW, th, S*S, D)
    windows = windows.reshape(tb, th, nh * nw, -1, d).transpose(1, 2)
    # one copy per image (a table shared by the batch is repeated)
    windows = windows.expand(batch, -1, -1, -1, -1)
    return windows.reshape(-1, th, windows.shape[-2], d)
