"""Draw iRPE bucket maps and index functions (PNG).

Two figures, after `Rethinking and Improving Relative Position Encoding for
Vision Transformer <https://arxiv.org/abs/2107.14222>`_ (Wu et al., ICCV
2021):

* ``buckets_<index>.png`` - for one reference (query) token on a
  ``height x width`` grid, the bucket of every key token under the four 2D
  methods (Eq. 19-25, supplementary Fig. 6-9): euclidean, quant, cross (its
  row-axis and its column-axis buckets, two panels) and product. Tokens in
  the same bucket share one encoding. Ids are
  :func:`mmpe.models.layers.get_bucket_ids_2d`'s, i.e. exactly what
  :class:`~mmpe.models.layers.iRPE` uses (cross column ids shown without
  their table offset).
* ``index_functions.png`` - the piecewise index function ``g(x)`` (Eq. 18)
  against Shaw et al.'s clip function with the same number of buckets
  (``k = floor(beta)``) over relative distances ``x`` (paper Fig. 2), one
  panel per ratio (the default 1.9 has only 7 buckets per axis, so a wider
  ratio is drawn too).

Example::

    python tools/analysis/visualize_buckets.py --grid 14x14 --ref 7 7 \\
        --out-dir work_dirs/buckets
"""
import argparse
import os
import os.path as osp
import re
from typing import List, Optional, Tuple

import matplotlib

matplotlib.use('Agg')  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from mmpe.models.layers.irpe.buckets import get_bucket_ids_2d
from mmpe.models.layers.irpe.index import (BucketSpec, clip_index,
                                           max_index, num_buckets_per_table,
                                           piecewise_index, ratio_to_abg)


def bucket_maps(height: int, width: int, ref: Tuple[int, int], index: str,
                ratio: float,
                max_distance: Optional[int]) -> List[Tuple[str, np.ndarray]]:
    """Bucket of every key for the query at ``ref``, per method.

    Args:
        height (int): Grid height.
        width (int): Grid width.
        ref (tuple[int, int]): (row, column) of the reference query.
        index (str): 'piecewise' or 'clip'.
        ratio (float): Ratio of the piecewise function.
        max_distance (int, optional): ``k`` of the clip function.

    Returns:
        list[tuple[str, np.ndarray]]: (title, (height, width) int map).
    """
    i = ref[0] * width + ref[1]
    maps = []
    for method in ('euclidean', 'quant', 'cross', 'product'):
        spec = BucketSpec(method, index, ratio, max_distance)
        ids = get_bucket_ids_2d(height, width, spec)
        n = num_buckets_per_table(spec)
        if method == 'cross':
            # (2, L, L): row-axis ids, then column-axis ids offset by n
            maps.append((f'cross, rows ({n} buckets)',
                         ids[0, i].view(height, width).numpy()))
            maps.append((f'cross, columns ({n} buckets)',
                         (ids[1, i] - n).view(height, width).numpy()))
        else:
            maps.append((f'{method} ({n} buckets)',
                         ids[i].view(height, width).numpy()))
    return maps


def plot_bucket_maps(path: str, height: int, width: int, ref: Tuple[int,
                                                                     int],
                     index: str, ratio: float, max_distance: Optional[int],
                     dpi: int) -> str:
    """Write the bucket-map figure; returns ``path``."""
    maps = bucket_maps(height, width, ref, index, ratio, max_distance)
    fig, axes = plt.subplots(
        1, len(maps), figsize=(3.2 * len(maps), 3.4), squeeze=False)
    for ax, (title, ids) in zip(axes[0], maps):
        # one colour per bucket id, ids printed when the grid is small
        cmap = plt.get_cmap('tab20', max(int(ids.max()) + 1, 1))
        ax.imshow(ids, cmap=cmap, vmin=-0.5, vmax=ids.max() + 0.5)
        if height * width <= 400:
            for (r, c), v in np.ndenumerate(ids):
                ax.text(c, r, str(v), ha='center', va='center', fontsize=5)
        ax.add_patch(
            plt.Rectangle((ref[1] - 0.5, ref[0] - 0.5), 1, 1, fill=False,
                          edgecolor='black', linewidth=1.5))
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    what = (f'piecewise, ratio {ratio:g}' if index == 'piecewise' else
            f'clip, k = {max_distance}')
    fig.suptitle(f'iRPE buckets of the keys for query (row {ref[0]}, col '
                 f'{ref[1]}) on a {height}x{width} grid ({what})')
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_index_functions(path: str, ratios: List[float], dpi: int) -> str:
    """Piecewise (Eq. 18) against clip, one panel per ratio, over
    ``[-2 gamma, 2 gamma]``; returns ``path``."""
    fig, axes = plt.subplots(
        1, len(ratios), figsize=(5.6 * len(ratios), 4.0), squeeze=False)
    for ax, ratio in zip(axes[0], ratios):
        alpha, beta, gamma = ratio_to_abg(ratio)
        k = max_index(BucketSpec(ratio=ratio))
        span = int(2 * gamma) + 1
        x = torch.arange(-span, span + 1)
        ax.step(x.numpy(), piecewise_index(x, alpha, beta, gamma).numpy(),
                where='mid', label='piecewise g(x), alpha:beta:gamma = '
                f'{alpha:g}:{beta:g}:{gamma:g}')
        ax.step(x.numpy(), clip_index(x, k).numpy(), where='mid',
                linestyle='--', label=f'clip(x, -{k}, {k})')
        for v in (alpha, gamma):
            for sign in (1, -1):
                ax.axvline(sign * v, color='grey', linewidth=0.6,
                           linestyle=':')
        ax.set_xlabel('relative distance x (tokens)')
        ax.set_ylabel('index')
        ax.set_title(f'ratio {ratio:g}: {2 * k + 1} buckets per axis '
                     '(dotted: +-alpha, +-gamma)', fontsize=9)
        ax.legend(fontsize=7, loc='upper left')
        ax.grid(alpha=0.3)
    fig.suptitle('Index functions: piecewise (exact near 0, logarithmic '
                 'up to gamma) vs clip')
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _grid(text: str) -> Tuple[int, int]:
    m = re.fullmatch(r'(\d+)x(\d+)', text)
    if not m:
        raise argparse.ArgumentTypeError(
            f'grid {text!r} must look like 14x14 (height x width)')
    return int(m.group(1)), int(m.group(2))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--grid', type=_grid, default=(14, 14),
                        help='token grid HxW (DeiT at 224 px: 14x14)')
    parser.add_argument('--ref', type=int, nargs=2, default=None,
                        metavar=('ROW', 'COL'),
                        help='reference query (default: the centre)')
    parser.add_argument('--index', choices=('piecewise', 'clip'),
                        default='piecewise')
    parser.add_argument('--ratio', type=float, default=1.9)
    parser.add_argument('--max-distance', type=int, default=None,
                        help="k of 'clip' (default: floor(2 * ratio))")
    parser.add_argument(
        '--curve-ratios', type=float, nargs='+', default=None,
        help='ratios of the index-function panels (default: --ratio and 8, '
        'where the logarithmic part is visible)')
    parser.add_argument('--out-dir', default='work_dirs/irpe_buckets')
    parser.add_argument('--dpi', type=int, default=150)
    args = parser.parse_args(argv)
    height, width = args.grid
    if args.ref is None:
        args.ref = [height // 2, width // 2]
    if not (0 <= args.ref[0] < height and 0 <= args.ref[1] < width):
        parser.error(f'--ref {args.ref} lies outside the {height}x{width} '
                     'grid')
    if args.ratio <= 0:
        parser.error(f'--ratio must be > 0, got {args.ratio}')
    if args.index == 'clip' and args.max_distance is None:
        args.max_distance = max_index(BucketSpec(ratio=args.ratio))
    if args.index == 'piecewise':
        args.max_distance = None
    if args.curve_ratios is None:
        args.curve_ratios = [args.ratio] + ([8.0] if args.ratio != 8 else [])
    if min(args.curve_ratios) <= 0:
        parser.error(f'--curve-ratios must be > 0, got {args.curve_ratios}')
    return args


def main(argv: Optional[List[str]] = None) -> List[str]:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    height, width = args.grid
    paths = [
        plot_bucket_maps(
            osp.join(args.out_dir, f'buckets_{args.index}.png'), height,
            width, tuple(args.ref), args.index, args.ratio, args.max_distance,
            args.dpi),
        plot_index_functions(
            osp.join(args.out_dir, 'index_functions.png'), args.curve_ratios,
            args.dpi)
    ]
    for p in paths:
        print(f'wrote {p}')
    return paths


if __name__ == '__main__':
    main()
