"""Draw the attention weights iRPE adds in each encoder block (PNG).

For one image, a DETR-iRPE config and (optionally) a checkpoint, and one
reference query token, every encoder self-attention layer's probabilities
are computed twice from the same queries and keys: with its iRPE terms on
queries / keys (Eq. 13-16 of `Rethinking and Improving Relative Position
Encoding for Vision Transformer <https://arxiv.org/abs/2107.14222>`_) and
without them. Their difference, averaged over heads and reshaped to the
feature grid, is drawn in one panel per layer, next to the image with the
reference point (the paper's Fig. 5). Positive (red): attention the relative
position encoding adds; negative (blue): attention it removes. iRPE on
values changes outputs, not weights, and does not appear.

Without a checkpoint the model is randomly initialised, its iRPE tables
drawn from the authors' Xavier init (also under a config with the paper's
zero init, where RPE would add nothing) so that the picture shows something;
the title says so.

Example::

    python tools/analysis/visualize_rpe_attention.py \\
        configs/quickstart/detr_irpe_r18_synthetic.py work_dirs/x/epoch.pth \\
        --img demo.jpg --point 120 80 --out work_dirs/rpe_attention.png
"""
import argparse
import copy
import math
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use('Agg')  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor  # noqa: E402

import mmcv  # noqa: E402
from mmdet.registry import MODELS  # noqa: E402
from mmdet.structures import DetDataSample  # noqa: E402
from mmdet.utils import register_all_modules  # noqa: E402
from mmengine.config import Config  # noqa: E402
from mmengine.runner import load_checkpoint  # noqa: E402


def attention_probs(attn, query: Tensor, key: Tensor,
                    key_padding_mask: Optional[Tensor],
                    spatial_shape: Sequence[int], index: int,
                    with_rpe: bool) -> Tensor:
    """Attention probabilities of one query token of an iRPE attention.

    Args:
        attn (iRPEMultiheadAttention): The layer (its weights and tables).
        query (Tensor): (bs, n, dims), batch-first, position added.
        key (Tensor): (bs, n, dims), position added.
        key_padding_mask (Tensor, optional): (bs, n), True at padding.
        spatial_shape (tuple[int, int]): Token grid (h, w).
        index (int): The query token.
        with_rpe (bool): Whether the iRPE terms on q / k are added.

    Returns:
        Tensor: (bs, heads, n), the softmax over keys for query ``index``.
    """
    w_q, w_k, _ = attn.attn.in_proj_weight.chunk(3)
    b_q, b_k, _ = attn.attn.in_proj_bias.chunk(3)
    # (bs, n, dims) -> (bs, heads, n, head_dims)
    q = attn.split_heads(F.linear(query, w_q, b_q))
    k = attn.split_heads(F.linear(key, w_k, b_k))
    scale = 1.0 / math.sqrt(attn.head_dims)
    q = q * scale
    logits = q[:, :, index:index + 1] @ k.transpose(-2, -1)  # (bs, H, 1, n)
    height, width = spatial_shape
    if with_rpe and attn.rpe_k is not None:
        logits = logits + attn.rpe_k(q, height, width)[:, :, index:index + 1]
    if with_rpe and attn.rpe_q is not None:
        term = attn.rpe_q(k * scale, height, width)
        logits = logits + term[:, :, index:index + 1]
    if key_padding_mask is not None:
        logits = logits.masked_fill(
            key_padding_mask[:, None, None, :].bool(), float('-inf'))
    return logits.softmax(-1)[:, :, 0]


class _Capture:
    """Forward pre-hooks recording each encoder self-attention's inputs."""

    def __init__(self, layers) -> None:
        self.calls: List[Dict] = []
        self.handles = [
            layer.self_attn.register_forward_pre_hook(
                self._hook, with_kwargs=True) for layer in layers
        ]

    def _hook(self, module, args, kwargs) -> None:
        names = ('query', 'key', 'value', 'identity', 'query_pos', 'key_pos')
        call = dict(zip(names, args))
        call.update(kwargs)
        call['module'] = module
        self.calls.append(call)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def rpe_attention_maps(model, inputs: Tensor, data_samples: List,
                       point: Tuple[float, float]) -> Dict:
    """Extra attention of the reference query, per encoder layer.

    Args:
        model (iRPEDETR): The detector, in eval mode.
        inputs (Tensor): (1, 3, H, W) preprocessed (padded) image.
        data_samples (list[DetDataSample]): Its data sample.
        point (tuple[float, float]): (x, y) of the reference point in the
            padded input's pixels.

    Returns:
        dict: ``diff`` (list of (h, w) arrays, with minus without RPE, mean
        over heads), ``with_rpe`` / ``without`` (lists of (h, w) arrays),
        ``grid`` (h, w), ``cell`` (row, column) of the reference query.
    """
    layers = model.encoder.layers
    if not all(hasattr(layer.self_attn, 'rpe_k') for layer in layers):
        raise ValueError('the config has no iRPE encoder (use an iRPEDETR '
                         'config, e.g. configs/quickstart/'
                         'detr_irpe_r18_synthetic.py)')
    capture = _Capture(layers)
    try:
        with torch.no_grad():
            model.forward(inputs, data_samples, mode='tensor')
    finally:
        capture.remove()
    out = dict(diff=[], with_rpe=[], without=[])
    for call in capture.calls:
        attn = call['module']
        query, key = call['query'], call.get('key')
        key = query if key is None else key
        qpos, kpos = call.get('query_pos'), call.get('key_pos')
        kpos = qpos if kpos is None else kpos
        if qpos is not None:
            query = query + qpos
        if kpos is not None:
            key = key + kpos
        if not attn.batch_first:
            query, key = query.transpose(0, 1), key.transpose(0, 1)
        height, width = call['spatial_shape']
        cell = (min(int(point[1] / inputs.shape[-2] * height), height - 1),
                min(int(point[0] / inputs.shape[-1] * width), width - 1))
        index = attn.skip + cell[0] * width + cell[1]
        with torch.no_grad():
            probs = [
                attention_probs(attn, query, key,
                                call.get('key_padding_mask'),
                                (height, width), index, flag).mean(1)[0]
                for flag in (True, False)
            ]
        grid = [p[attn.skip:].view(height, width).cpu().numpy() for p in probs]
        out['with_rpe'].append(grid[0])
        out['without'].append(grid[1])
        out['diff'].append(grid[0] - grid[1])
        out['grid'], out['cell'] = (height, width), cell
    return out


def load_image(path: str, scale: Optional[Tuple[int, int]]) -> np.ndarray:
    """BGR uint8 image, optionally rescaled to fit ``scale`` (w, h)."""
    img = mmcv.imread(path)
    if img is None:
        raise FileNotFoundError(f'cannot read image {path!r}')
    if scale is not None:
        img = mmcv.imrescale(img, scale)
    return img


def prepare(model, img: np.ndarray) -> Tuple[Tensor, List]:
    """The model's preprocessed (normalised, padded) input of one image."""
    h, w = img.shape[:2]
    sample = DetDataSample(
        metainfo=dict(
            img_shape=(h, w),
            ori_shape=(h, w),
            scale_factor=(1.0, 1.0),
            img_id=0,
            img_path=''))
    tensor = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
    data = model.data_preprocessor(
        dict(inputs=[tensor], data_samples=[sample]), False)
    return data['inputs'], data['data_samples']


def plot(path: str, img: np.ndarray, maps: Dict, point: Tuple[float, float],
         title: str, dpi: int) -> str:
    """Image with the reference point, then one panel per layer."""
    diffs = maps['diff']
    n = len(diffs) + 1
    cols = min(n, 4)
    rows = int(math.ceil(n / cols))
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.4 * cols, 3.0 * rows), squeeze=False)
    axes = axes.ravel()
    axes[0].imshow(img[..., ::-1])  # BGR -> RGB
    axes[0].plot([point[0]], [point[1]], marker='x', color='yellow',
                 markersize=10, mew=3)
    axes[0].set_title('image, reference query (x)', fontsize=9)
    lim = max(float(np.abs(d).max()) for d in diffs) or 1.0
    for i, d in enumerate(diffs):
        ax = axes[i + 1]
        im = ax.imshow(d, cmap='RdBu_r', vmin=-lim, vmax=lim)
        ax.plot([maps['cell'][1]], [maps['cell'][0]], marker='x',
                color='black', markersize=7, mew=2)
        ax.set_title(f'block {i + 1}: extra attention', fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in axes[n:]:
        ax.axis('off')
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='a DETR-iRPE config')
    parser.add_argument('checkpoint', nargs='?', default=None,
                        help='checkpoint (default: random init)')
    parser.add_argument('--img', required=True, help='input image')
    parser.add_argument(
        '--point', type=float, nargs=2, default=None, metavar=('X', 'Y'),
        help='reference point in the (rescaled) image pixels (default: '
        'the centre)')
    parser.add_argument('--scale', type=int, nargs=2, default=None,
                        metavar=('W', 'H'),
                        help='rescale the image to fit W x H first')
    parser.add_argument('--seed', type=int, default=0,
                        help='seed of the random init (no checkpoint)')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--out', default='work_dirs/rpe_attention.png')
    parser.add_argument('--dpi', type=int, default=150)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> str:
    args = parse_args(argv)
    register_all_modules(init_default_scope=True)
    import mmpe  # noqa: F401  (registers mmpe's modules)
    from mmpe.models.layers import iRPE

    cfg = Config.fromfile(args.config)
    torch.manual_seed(args.seed)
    model = MODELS.build(copy.deepcopy(cfg.model))
    if args.checkpoint:
        from mmpe.engine import safe_checkpoint_loading
        with safe_checkpoint_loading():  # weights-only, also older files
            load_checkpoint(model, args.checkpoint, map_location='cpu')
        how = f'checkpoint {osp.basename(args.checkpoint)}'
    else:
        model.init_weights()
        for m in model.modules():
            if isinstance(m, iRPE):
                m.init = 'xavier'
                m.reset_table()
        how = 'random init (iRPE tables: Xavier)'
    model.to(args.device).eval()
    img = load_image(args.img, tuple(args.scale) if args.scale else None)
    inputs, samples = prepare(model, img)
    point = tuple(args.point) if args.point else (img.shape[1] / 2,
                                                  img.shape[0] / 2)
    maps = rpe_attention_maps(model, inputs, samples, point)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    title = (f'{osp.basename(args.config)}, {how}: attention added by iRPE '
             f'(with minus without, mean over heads), grid {maps["grid"]}')
    plot(args.out, img, maps, point, title, args.dpi)
    print(f'wrote {args.out}')
    return args.out


if __name__ == '__main__':
    main()
