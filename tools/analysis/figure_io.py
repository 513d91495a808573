"""Reading the documentation's figure data (``docs/data/*.json``) and
writing the figures of ``make_figures.py``: one file, one dpi, PNG metadata
without the matplotlib version (so that a figure drawn again from the same
data by another matplotlib differs only where pixels differ)."""
import json
import os.path as osp
from typing import Optional, Tuple

import matplotlib

matplotlib.use('Agg')  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

DPI = 130
PNG_METADATA = {'Software': None}


def load_data(data_dir: str, name: str) -> Optional[dict]:
    """``data_dir/name.json``, or None (with a message) when missing."""
    path = osp.join(data_dir, f'{name}.json')
    if not osp.isfile(path):
        print(f'[make_figures] {path} not found: skipped')
        return None
    with open(path) as f:
        return json.load(f)


def row_stats(row: dict) -> Tuple[np.ndarray, np.ndarray]:
    """Mean and sample std per point of a data row: from its per-seed
    values when it has them (``seeds``: one list per seed), else its
    published ``mean`` / ``std``."""
    if 'seeds' in row:
        values = np.asarray(row['seeds'], dtype=float)  # (seeds, points)
        std = (values.std(axis=0, ddof=1) if len(values) > 1 else
               np.zeros(values.shape[1]))
        return values.mean(axis=0), std
    mean = np.asarray(row['mean'], dtype=float)
    return mean, np.asarray(row.get('std', [0.0] * len(mean)), dtype=float)


def save_png(fig, path: str, dpi: int = DPI) -> str:
    """Write ``fig`` to ``path`` (PNG) and close it."""
    fig.savefig(path, dpi=dpi, metadata=PNG_METADATA)
    plt.close(fig)
    print(f'[make_figures] wrote {path}')
    return path
