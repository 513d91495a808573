"""The benchmark figures (``make_figures.py``): attention time and peak
memory over the DETR grids and over long sequences, as the benchmark JSON
in ``docs/data`` holds them."""
from typing import Dict, List, Optional, Tuple

from figure_io import load_data, plt, save_png


def fig_attention_vs_length(data_dir: str, out: str) -> Optional[str]:
    data = load_data(data_dir, 'attention_grids')
    if data is None:
        return None
    tokens = data['tokens']
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for row in data['rows']:
        left.plot(tokens, row['x'], marker='o', label=row['name'])
        right.plot(tokens, row['peak_mb'], marker='o', label=row['name'])
    ticks = [f'{t}\n({g})' for t, g in zip(tokens, data['grids'])]
    for ax in (left, right):
        ax.set_xscale('log')
        ax.set_xticks(tokens)
        ax.set_xticklabels(ticks, fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel('tokens L (DETR feature grid)')
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.set_ylabel('fwd+bwd time / mmcv MHA of the same run')
    left.set_title('time, relative to mmcv\'s attention', fontsize=10)
    right.set_yscale('log')
    right.set_ylabel('peak MB, fwd+bwd')
    right.set_title('peak memory of one fwd+bwd', fontsize=10)
    fig.tight_layout()
    return save_png(fig, out)


def fig_attention_long(data_dir: str, out: str) -> Optional[str]:
    """Time over the fused no-RPE path and peak memory of one layer's
    fwd+bwd against L, per head configuration (rows) and variant (lines;
    compiled dashed)."""
    data = load_data(data_dir, 'attention_long')
    if data is None:
        return None
    cfgs = list(dict.fromkeys(g['cfg'] for g in data['groups']))
    fig, axes = plt.subplots(len(cfgs), 2, figsize=(10, 3.6 * len(cfgs)),
                             squeeze=False)
    for (left, right), cfg in zip(axes, cfgs):
        groups = sorted((g for g in data['groups'] if g['cfg'] == cfg),
                        key=lambda g: g['length'])
        lines: Dict[Tuple[str, str], List[Tuple[int, dict]]] = {}
        for g in groups:
            for r in g['rows']:
                lines.setdefault((r['variant'], r['mode']), []).append(
                    (g['length'], r))
        colours: Dict[str, str] = {}
        for (variant, mode), points in lines.items():
            colour = colours.setdefault(variant, f'C{len(colours)}')
            style = dict(color=colour, marker='o',
                         linestyle='-' if mode == 'eager' else '--',
                         label=f'{variant} {mode}')
            length = [n for n, _ in points]
            left.plot(length, [r['x'] for _, r in points], **style)
            right.plot(length, [r['peak_mb'] for _, r in points], **style)
        tokens = [g['length'] for g in groups]
        for ax in (left, right):
            ax.set_xscale('log')
            ax.set_xticks(tokens)
            ax.set_xticklabels([str(t) for t in tokens], fontsize=8)
            ax.minorticks_off()
            ax.set_xlabel('tokens L')
            ax.grid(alpha=0.3)
        left.set_ylabel('fwd+bwd time / fused no-RPE')
        left.set_title(f'{cfg}: time, relative to the fused path of the '
                       'same mode', fontsize=10)
        right.set_yscale('log')
        right.set_ylabel('peak MB (tensors), fwd+bwd')
        right.set_title(f'{cfg}: peak memory of one fwd+bwd', fontsize=10)
        right.legend(fontsize=6, loc='upper left')
    fig.tight_layout()
    return save_png(fig, out)
