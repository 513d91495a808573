"""The window layout (mmpe.models.layers.windows.window) against loops over
windows and tokens written here: token partition and merge, the key mask, and
per-token tables of every layout (shared, per head, per image, per image
and head)."""
import pytest
import torch

from mmpe.models.layers import (merge_windows, window_key_mask, window_table,
                                window_tokens)

#: (h, w, S): whole windows, a ragged bottom / right, a grid smaller than
#: one window
GRIDS = [(6, 9, 3), (5, 7, 3), (7, 4, 2), (2, 3, 4)]


def _windows_loop(h, w, s):
    """[(image-free window index, [(slot, token index or None)])], windows
    row-major from the top-left, slots row-major in a window."""
    nh, nw = -(-h // s), -(-w // s)
    out = []
    for i in range(nh):
        for j in range(nw):
            slots = []
            for pr in range(s):
                for pc in range(s):
                    r, c = i * s + pr, j * s + pc
                    slots.append((pr * s + pc,
                                  r * w + c if r < h and c < w else None))
            out.append((i * nw + j, slots))
    return out, nh * nw


@pytest.mark.parametrize('h,w,s', GRIDS)
def test_tokens_in_and_out_of_windows(h, w, s):
    b, c = 2, 5
    x = torch.randn(b, h * w, c)
    windows = window_tokens(x, (h, w), s)
    layout, n_win = _windows_loop(h, w, s)
    assert windows.shape == (b * n_win, s * s, c)
    for img in range(b):
        for win, slots in layout:
            for slot, token in slots:
                want = x[img, token] if token is not None else torch.zeros(c)
                assert torch.equal(windows[img * n_win + win, slot], want)
    assert torch.equal(merge_windows(windows, (h, w), s), x)


@pytest.mark.parametrize('h,w,s', GRIDS)
def test_key_mask_marks_window_padding_and_given_padding(h, w, s):
    b = 3
    given = torch.zeros(b, h, w, dtype=torch.bool)
    given[1, h // 2:] = True  # image 1: the bottom half is batch padding
    given[2] = True
    given[2, 0, 0] = False  # image 2: one valid token
    layout, n_win = _windows_loop(h, w, s)
    mask = window_key_mask(given.flatten(1), b, (h, w), s, 'cpu')
    assert mask.shape == (b * n_win, s * s)
    for img in range(b):
        for win, slots in layout:
            want = [token is None or bool(given[img].flatten()[token])
                    for _, token in slots]
            if all(want):  # no key left: the window is left unmasked
                want = [False] * len(want)
            assert mask[img * n_win + win].tolist() == want
    # nothing given: only the grid's padding to whole windows
    plain = window_key_mask(None, b, (h, w), s, 'cpu')
    if h % s == 0 and w % s == 0:
        assert plain is None  # eager shortcut
    else:
        for win, slots in layout:
            want = [token is None for _, token in slots]
            assert plain[win].tolist() == want
            assert plain[n_win + win].tolist() == want


@pytest.mark.parametrize('h,w,s', GRIDS)
@pytest.mark.parametrize('layout', ['(L,D)', '(H,L,D)', '(B,L,D)',
                                    '(B,H,L,D)', '(1,H,L,D)', '(B,1,L,D)'])
def test_table_rows_follow_their_tokens(h, w, s, layout):
    """Every token's row in the windows is its row of the full-grid table,
    for the image the window belongs to and every head."""
    b, heads, d = 2, 3, 4
    shape = {
        '(L,D)': (h * w, d), '(H,L,D)': (heads, h * w, d),
        '(B,L,D)': (b, h * w, d), '(B,H,L,D)': (b, heads, h * w, d),
        '(1,H,L,D)': (1, heads, h * w, d), '(B,1,L,D)': (b, 1, h * w, d)
    }[layout]
    table = torch.randn(shape)
    got = window_table(table, b, (h, w), s, batched=layout == '(B,L,D)')
    win_layout, n_win = _windows_loop(h, w, s)
    per_head = 'H' in layout
    assert got.shape == (b * n_win, heads if per_head else 1, s * s, d)

    def row(img, head, token):
        if layout == '(L,D)':
            return table[token]
        if layout == '(H,L,D)':
            return table[head, token]
        if layout == '(B,L,D)':
            return table[img, token]
        return table[img if shape[0] == b else 0,
                     head if shape[1] == heads else 0, token]

    for img in range(b):
        for win, slots in win_layout:
            for slot, token in slots:
                for head in range(got.shape[1]):
                    want = torch.zeros(d) if token is None else row(
                        img, head, token)
                    assert torch.equal(got[img * n_win + win, head, slot],
                                       want)


def test_table_of_other_rank_is_refused():
    with pytest.raises(ValueError, match=r'window_table: a table of shape '
                       r'\(1, 1, 1, 6, 4\)'):
        window_table(torch.zeros(1, 1, 1, 6, 4), 1, (2, 3), 2)
