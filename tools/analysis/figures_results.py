"""The figures of training results (``make_figures.py``): the demo's
curves and loss, the test-size panels of the encoder and segmentation
studies, the decoder-bias curves; drawn from ``docs/data`` as the files
hold the numbers (per-seed rows as mean and sample std)."""
from typing import Dict, Optional

import numpy as np
from figure_io import load_data, plt, row_stats, save_png


def fig_demo_curves(data_dir: str, out: str) -> Optional[str]:
    data = load_data(data_dir, 'demo_curves')
    if data is None:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    seeds = data['make_demo_seeds']
    for name, values in seeds['bbox_mAP_50'].items():
        left.plot(seeds['epochs'], values, marker='o', label=name)
    left.set_title('make demo: DETR-iRPE, 3 seeds, 1 thread', fontsize=10)
    left.set_xlabel('epoch (lr x0.1 after 16)')
    left.set_xticks(seeds['epochs'])
    right.set_title('DETR family with iRPE at the demo\'s training compute',
                    fontsize=10)
    for run in data['equal_compute']:
        frac = np.asarray(run['epochs'], dtype=float) / run['max_epochs']
        right.plot(frac, run['bbox_mAP_50'], marker='o', label=run['name'])
    right.set_xlabel('fraction of the training compute (epoch / epochs)')
    for ax in (left, right):
        ax.set_ylabel('validation bbox AP50')
        ax.set_ylim(0, None)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_png(fig, out)


def _scale_panels(data: dict, out: str, ylabel: str,
                  legend_loc: str = 'best') -> str:
    panels = data['panels']
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.2 * len(panels), 3.9), squeeze=False)
    scales = data['scales']
    for ax, panel in zip(axes[0], panels):
        for i, row in enumerate(panel['rows']):
            mean, std = row_stats(row)
            # a small sideways offset per row keeps the error bars apart
            offset = (i - (len(panel['rows']) - 1) / 2) * 0.012
            ax.errorbar([s + offset for s in scales], mean, yerr=std,
                        marker='o', capsize=3, label=row['name'])
        ax.set_title(panel['title'], fontsize=10)
        ax.set_xticks(scales)
        ax.set_xticklabels([f'x{s:g}' for s in scales])
        ax.set_xlabel('test image scale (trained at x1)')
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc=legend_loc)
    fig.tight_layout()
    return save_png(fig, out)


def fig_encoder_pe_scales(data_dir: str, out: str) -> Optional[str]:
    data = load_data(data_dir, 'encoder_pe_scales')
    if data is None:
        return None
    return _scale_panels(data, out, 'bbox AP50 (mean ± std, 3 seeds)')


def fig_seg_scales(data_dir: str, out: str) -> Optional[str]:
    data = load_data(data_dir, 'seg_scales')
    if data is None:
        return None
    return _scale_panels(data, out, 'mIoU % (mean ± std, 3 seeds)')


def fig_decoder_rpb(data_dir: str, out: str) -> Optional[str]:
    """Validation AP50 by epoch, with the bias (solid) and without
    (dashed), one colour per encoder: mean over seeds, the band one sample
    std either side."""
    data = load_data(data_dir, 'decoder_rpb')
    if data is None:
        return None
    panels = data['panels']
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.2 * len(panels), 3.9), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        epochs = panel['epochs']
        colours: Dict[str, str] = {}
        for row in panel['rows']:
            mean, std = row_stats(row)
            encoder = 'iRPE' if 'iRPE' in row['name'] else 'sine'
            colour = colours.setdefault(encoder, f'C{len(colours)}')
            n = len(row['seeds'])
            ax.plot(epochs, mean, color=colour, marker='o',
                    linestyle='-' if row['bias'] else '--',
                    label=f"{row['name']} ({n} seed{'s' * (n > 1)})")
            if n > 1:
                ax.fill_between(epochs, mean - std, mean + std,
                                color=colour, alpha=0.12 if row['bias']
                                else 0.06, linewidth=0)
        ax.set_title(panel['title'], fontsize=10)
        ax.set_xticks(epochs)
        ax.set_xlabel('epoch (solid: with the bias, dashed: without)')
        ax.set_ylabel('validation bbox AP50 (mean, band ± std)')
        ax.set_ylim(0, None)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc='upper left')
    fig.tight_layout()
    return save_png(fig, out)


def fig_demo_loss(data_dir: str, out: str) -> Optional[str]:
    data = load_data(data_dir, 'demo_scalars')
    if data is None:
        return None
    train = [r for r in data['records'] if 'loss' in r]
    val = [r for r in data['records'] if 'coco/bbox_mAP_50' in r]
    fig, left = plt.subplots(figsize=(7, 3.6))
    left.plot([r['step'] for r in train], [r['loss'] for r in train],
              color='tab:blue')
    left.set_xlabel('iteration')
    left.set_ylabel('training loss (all decoder layers)', color='tab:blue')
    left.grid(alpha=0.3)
    if val and train:
        # validation is logged per epoch; place it at the epoch's last
        # iteration (iterations per epoch from the logged records)
        iters = max(r['step'] for r in train) / max(r['step'] for r in val)
        right = left.twinx()
        right.plot([r['step'] * iters for r in val],
                   [r['coco/bbox_mAP_50'] for r in val], color='tab:red',
                   marker='o', label='validation bbox AP50')
        right.set_ylabel('validation bbox AP50', color='tab:red')
        right.set_ylim(0, None)
    left.set_title('make demo: training loss and validation AP50',
                   fontsize=10)
    fig.tight_layout()
    return save_png(fig, out)
