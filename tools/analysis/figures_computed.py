"""The computed figures (``make_figures.py``): the iRPE bucket maps and
index functions (what ``iRPE`` uses), sample images of the embedded data
set (its generator), and the iRPE attention map of a ``make demo`` run's
last checkpoint (``visualize_rpe_attention.py``)."""
import glob
import json
import os.path as osp
import tempfile
from typing import Optional

from figure_io import DPI, plt, save_png

#: the repository root: the demo's config path is relative to it
ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
DEMO_CONFIG = 'configs/quickstart/detr_irpe_r18_synthetic.py'


def fig_irpe_buckets(data_dir: str, out: str) -> Optional[str]:
    """Product-method buckets under piecewise and clip on a 14 x 14 grid
    for the centre query, and the two index functions (computed)."""
    import torch

    from mmpe.models.layers.irpe.index import (BucketSpec, clip_index,
                                               max_index, piecewise_index,
                                               ratio_to_abg)
    import visualize_buckets as buckets  # this folder's script
    height = width = 14
    ref = (7, 7)
    ratio = 1.9
    k = max_index(BucketSpec(ratio=ratio))  # clip with the same bucket count
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.9))
    for ax, (index, title) in zip(axes[:2], [
        ('piecewise', f'product, piecewise (ratio {ratio:g})'),
        ('clip', f'product, clip (k = {k})'),
    ]):
        maps = dict(
            buckets.bucket_maps(height, width, ref, index, ratio,
                                k if index == 'clip' else None))
        name = next(n for n in maps if n.startswith('product'))
        ids = maps[name]
        cmap = plt.get_cmap('tab20', int(ids.max()) + 1)
        ax.imshow(ids, cmap=cmap, vmin=-0.5, vmax=ids.max() + 0.5)
        ax.add_patch(
            plt.Rectangle((ref[1] - 0.5, ref[0] - 0.5), 1, 1, fill=False,
                          edgecolor='black', linewidth=1.5))
        ax.set_title(f'{title}: {int(ids.max()) + 1} buckets', fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    alpha, beta, gamma = ratio_to_abg(ratio)
    x = torch.arange(-int(2 * gamma) - 1, int(2 * gamma) + 2)
    ax = axes[2]
    ax.step(x.numpy(), piecewise_index(x, alpha, beta, gamma).numpy(),
            where='mid', label=f'piecewise (Eq. 18), ratio {ratio:g}')
    ax.step(x.numpy(), clip_index(x, k).numpy(), where='mid',
            linestyle='--', label=f'clip(x, -{k}, {k})')
    ax.set_xlabel('relative distance x (tokens)')
    ax.set_ylabel('index per axis')
    ax.set_title('index functions', fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='upper left')
    fig.suptitle(f'keys sharing a bucket with the centre query of a '
                 f'{height} x {width} grid', fontsize=10)
    fig.tight_layout()
    return save_png(fig, out)


def fig_embedded_dataset(data_dir: str, out: str) -> Optional[str]:
    """The first training images of the embedded set (seed 0) with their
    boxes, drawn with class hues and with ``object_hue='random'``."""
    from mmpe.datasets import generate_synthetic_coco
    num = 6
    names = ('square', 'disk', 'triangle', 'ring')
    fig, axes = plt.subplots(2, num, figsize=(2.1 * num, 4.6))
    with tempfile.TemporaryDirectory() as tmp:
        for row, hue in enumerate(('class', 'random')):
            root = osp.join(tmp, hue)
            generate_synthetic_coco(root, num_train=num, num_val=0, seed=0,
                                    img_format='png', object_hue=hue)
            with open(osp.join(root, 'annotations',
                               'instances_train.json')) as f:
                coco = json.load(f)
            images = sorted(coco['images'], key=lambda im: im['id'])
            for ax, im in zip(axes[row], images):
                img = plt.imread(osp.join(root, 'train', im['file_name']))
                ax.imshow(img)
                for ann in coco['annotations']:
                    if ann['image_id'] != im['id']:
                        continue
                    x, y, w, h = ann['bbox']
                    ax.add_patch(
                        plt.Rectangle((x, y), w, h, fill=False,
                                      edgecolor='white', linewidth=1))
                    ax.text(x, y, names[ann['category_id'] - 1],
                            color='white', fontsize=6, va='bottom')
                ax.set_xticks([])
                ax.set_yticks([])
            axes[row][0].set_ylabel(f'object_hue={hue!r}', fontsize=8)
    fig.tight_layout()
    return save_png(fig, out, dpi=90)  # photographs: keep the file small


def _demo_checkpoint(work_dir: str) -> Optional[str]:
    pointer = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(pointer):
        with open(pointer) as f:
            path = f.read().strip()
        if osp.isfile(path):
            return path
    ckpts = sorted(glob.glob(osp.join(work_dir, 'epoch_*.pth')),
                   key=lambda p: int(p.rsplit('_', 1)[1].split('.')[0]))
    return ckpts[-1] if ckpts else None


def fig_rpe_attention(demo_work_dir: Optional[str],
                      out: str) -> Optional[str]:
    """visualize_rpe_attention.py on the demo's last checkpoint for the
    first validation image of the embedded set (regenerated, identical)."""
    ckpt = _demo_checkpoint(demo_work_dir) if demo_work_dir else None
    if ckpt is None:
        print('[make_figures] rpe_attention: no --demo-work-dir with a '
              'checkpoint: skipped')
        return None
    from mmpe.datasets import generate_synthetic_coco
    with tempfile.TemporaryDirectory() as tmp:
        generate_synthetic_coco(tmp, num_train=0, num_val=1, seed=0)
        img = osp.join(tmp, 'val', '000000.jpg')
        import visualize_rpe_attention as tool  # this folder's script
        tool.main([
            osp.join(ROOT, DEMO_CONFIG), ckpt, '--img', img, '--out', out,
            '--dpi',
            str(DPI)
        ])
    print(f'[make_figures] wrote {out} ({ckpt})')
    return out
