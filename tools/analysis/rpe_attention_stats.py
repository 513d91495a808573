"""How much a DETR-iRPE's relative position tables do: numbers, not a picture.

For a config and trained checkpoints, over a folder of images with the
reference query at each image's centre, the attention that iRPE adds in the
encoder (the difference drawn by ``visualize_rpe_attention.py``: softmax with
minus without the iRPE terms, mean over heads; Eq. 13-16 of the iRPE paper)
is summarised as

- ``extra_mean``: mean |extra attention| over layers, keys and images (a
  key's average weight is 1/n for n keys, e.g. 4e-3 on a 16 x 16 grid);
- ``extra_peak``: the largest |extra attention| of any layer and key (what
  the picture's colour scale shows), averaged over images;

and the tables themselves by ``table_mean_abs`` / ``table_max_abs``. With
``--seeds`` (one per checkpoint: the run's ``randomness.seed``), each run's
initial tables are re-drawn as mmengine's Runner draws them (seed, build the
model, ``init_weights``) and ``shift_mean`` / ``shift_max`` say how far
training moved them. With no checkpoint, the config's own initialisation
(``--seeds``, default 0) is measured.

Example (the quick-start DETR-iRPE of the proxy study, seeds 0-2)::

    python tools/analysis/rpe_attention_stats.py \\
        configs/quickstart/detr_irpe_r18_synthetic.py \\
        work_dirs/ablation/irpe_tab6/6_sine_p_ctx_piecewise_seed{0,1,2}/epoch_8.pth \\
        --seeds 0 1 2 --img-dir data/synthetic_coco/val --images 20
"""
import argparse
import copy
import glob
import json
import os.path as osp
from typing import Dict, List, Optional

import numpy as np
import torch

import visualize_rpe_attention as vis  # this folder's script
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.config import Config
from mmengine.runner import load_checkpoint

from mmpe.utils.tool_args import add_cfg_options, load_config


def build(cfg: Config, seed: int):
    """The model as the Runner initialises it under ``randomness.seed``."""
    torch.manual_seed(seed)
    model = MODELS.build(copy.deepcopy(cfg.model))
    model.init_weights()
    return model


def tables(model) -> Dict[str, torch.Tensor]:
    """{parameter name: copy of the iRPE table} of the model."""
    from mmpe.models.layers import iRPE
    return {
        f'{name}.table': m.table.detach().clone()
        for name, m in model.named_modules() if isinstance(m, iRPE)
    }


def extra_attention(model, images: List[str]) -> Dict[str, float]:
    """Mean and peak |extra attention| of the centre query, see the module
    docstring."""
    means, peaks = [], []
    for path in images:
        img = vis.load_image(path, None)
        inputs, samples = vis.prepare(model, img)
        centre = (img.shape[1] / 2, img.shape[0] / 2)
        diffs = vis.rpe_attention_maps(model, inputs, samples,
                                       centre)['diff']
        means.append(np.mean([np.abs(d).mean() for d in diffs]))
        peaks.append(max(np.abs(d).max() for d in diffs))
    return dict(extra_mean=float(np.mean(means)),
                extra_peak=float(np.mean(peaks)))


def measure(cfg: Config, checkpoint: Optional[str], seed: Optional[int],
            images: List[str]) -> Dict:
    """All the numbers for one checkpoint (or the initialisation)."""
    model = build(cfg, 0 if seed is None else seed)
    start = tables(model)
    if not start:
        raise ValueError('the config has no iRPE tables (use a DETR-iRPE '
                         'config, e.g. configs/quickstart/'
                         'detr_irpe_r18_synthetic.py)')
    if checkpoint:
        load_checkpoint(model, checkpoint, map_location='cpu',
                        logger='silent')
    model.eval()
    now = tables(model)
    flat = torch.cat([t.flatten() for t in now.values()])
    out = dict(
        checkpoint=checkpoint, seed=seed,
        table_mean_abs=flat.abs().mean().item(),
        table_max_abs=flat.abs().max().item())
    if checkpoint and seed is not None:
        shift = torch.cat([(now[k] - start[k]).flatten() for k in now]).abs()
        out.update(shift_mean=shift.mean().item(),
                   shift_max=shift.max().item())
    out.update(extra_attention(model, images))
    return out


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='a DETR-iRPE config')
    parser.add_argument('checkpoints', nargs='*',
                        help='checkpoints (none: the initialisation)')
    parser.add_argument('--seeds', type=int, nargs='+', default=None,
                        help='randomness.seed of each run (one per '
                        'checkpoint): re-draws its initial tables')
    parser.add_argument('--img-dir', default='data/synthetic_coco/val')
    parser.add_argument('--images', type=int, default=20,
                        help='the first N images of --img-dir (sorted)')
    parser.add_argument('--out', help='JSON of the results')
    add_cfg_options(parser)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> List[Dict]:
    args = parse_args(argv)
    register_all_modules(init_default_scope=True)
    import mmpe  # noqa: F401  (registers mmpe's modules)
    cfg = load_config(args.config, args.cfg_options)
    images = sorted(
        p for p in glob.glob(osp.join(args.img_dir, '*'))
        if p.lower().endswith(('.jpg', '.jpeg', '.png')))[:args.images]
    if not images:
        raise FileNotFoundError(f'no images in {args.img_dir!r}')
    checkpoints = args.checkpoints or [None] * len(args.seeds or [0])
    seeds = args.seeds or [None] * len(checkpoints)
    if len(seeds) != len(checkpoints):
        raise ValueError(f'--seeds gives {len(seeds)} seeds for '
                         f'{len(checkpoints)} checkpoints; give one each')
    results = []
    for ckpt, seed in zip(checkpoints, seeds):
        results.append(measure(cfg, ckpt, seed, images))
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == '__main__':
    main()
