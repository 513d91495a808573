"""Train-step time of the quick-start DETR against DETR-iRPE, side by side.

Builds the two quick-start models (``configs/quickstart/detr_r18_synthetic.py``
and its iRPE twin ``detr_irpe_r18_synthetic.py``, or any configs given),
their optimiser wrappers from the configs, and one fixed batch of images
shaped like the embedded synthetic data set (random sizes in
``--min-size``..``--max-size`` px, aspect ratios up to 3:1, so the batch is
padded; 1-5 boxes of 4 classes, ``mmdet.testing.demo_mm_inputs``). A train
step is what mmengine's runner does per iteration: ``model.train_step(data,
optim_wrapper)`` = data preprocessor (normalise, pad), forward with the
losses (Hungarian matching included), backward, gradient clipping, optimiser
step. The models take turns (round-robin, after ``--warmup`` steps each) and
the median step time of each is reported with the ratio to the first config,
then written as JSON with ``--out``::

    python tools/benchmark/train_step.py --out work_dirs/train_step.json
    python tools/benchmark/train_step.py --quick
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from typing import List, Optional

import numpy as np
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mmdet.registry import MODELS  # noqa: E402
from mmdet.testing import demo_mm_inputs  # noqa: E402
from mmdet.utils import register_all_modules  # noqa: E402
from mmengine.config import Config  # noqa: E402
from mmengine.optim import build_optim_wrapper  # noqa: E402

CONFIGS = [
    'configs/quickstart/detr_r18_synthetic.py',
    'configs/quickstart/detr_irpe_r18_synthetic.py'
]


def make_batch(batch: int, min_size: int, max_size: int, num_classes: int,
               seed: int) -> dict:
    """One packed batch (``inputs``, ``data_samples``) of varied sizes."""
    rng = np.random.default_rng(seed)
    shapes = []
    for _ in range(batch):
        long = int(rng.integers(min_size, max_size + 1))
        short = max(8, int(long / rng.uniform(1.0, 3.0)))
        h, w = (long, short) if rng.random() < 0.5 else (short, long)
        shapes.append((3, h, w))
    items = [int(n) for n in rng.integers(1, 6, size=batch)]
    torch.manual_seed(seed)
    return demo_mm_inputs(
        batch_size=batch,
        image_shapes=shapes,
        num_items=items,
        num_classes=num_classes)


def build(cfg_path: str, device: torch.device):
    """Model (initialised, train mode) and optimiser wrapper of a config."""
    cfg = Config.fromfile(cfg_path)
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(cfg.model))
    model.init_weights()
    model.to(device).train()
    optim = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    num_classes = cfg.model.bbox_head.num_classes
    return model, optim, num_classes


def step(model, optim, packed: dict, device: torch.device) -> float:
    """Seconds of one ``model.train_step``."""
    data = dict(
        inputs=[t.to(device) for t in packed['inputs']],
        data_samples=[s.to(device) for s in packed['data_samples']])
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    losses = model.train_step(data, optim)
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    for name, value in losses.items():
        if not torch.isfinite(value).all():
            raise RuntimeError(f'non-finite {name} in a benchmark step')
    return elapsed


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('configs', nargs='*', default=CONFIGS,
                        help='configs to compare; ratios are to the first')
    parser.add_argument('--batch', type=int, default=8,
                        help='images per step (the quick-start batch size)')
    parser.add_argument('--min-size', type=int, default=128)
    parser.add_argument('--max-size', type=int, default=256)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--rounds', type=int, default=10)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--device', default='cpu',
                        help="'cpu', 'cuda' or 'auto'")
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument('--quick', action='store_true',
                        help='batch 2 of 64-96 px images, 1 warm-up, 2 rounds')
    parser.add_argument('--out', help='write the results as JSON here')
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.min_size, args.max_size = 2, 64, 96
        args.warmup, args.rounds = 1, 2
    return args


def main(argv: Optional[List[str]] = None) -> dict:
    args = parse_args(argv)
    register_all_modules(init_default_scope=True)
    import mmpe  # noqa: F401  (registers mmpe's modules)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    if dev == 'auto':
        dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    device = torch.device(dev)
    configs = [
        c if os.path.isabs(c) or os.path.exists(c) else os.path.join(ROOT, c)
        for c in args.configs
    ]
    built = [build(c, device) for c in configs]
    packed = make_batch(args.batch, args.min_size, args.max_size,
                        built[0][2], args.seed)
    times: List[List[float]] = [[] for _ in built]
    for _ in range(args.warmup):
        for model, optim, _ in built:
            step(model, optim, packed, device)
    for _ in range(args.rounds):  # interleaved
        for i, (model, optim, _) in enumerate(built):
            times[i].append(step(model, optim, packed, device))
    with torch.no_grad():
        data = built[0][0].data_preprocessor(packed, True)
        feats = built[0][0].extract_feat(data['inputs'])
        grid = tuple(int(s) for s in feats[-1].shape[-2:])
    base = statistics.median(times[0])
    rows = []
    for cfg, ts, (model, _, _) in zip(args.configs, times, built):
        med = statistics.median(ts)
        rows.append(
            dict(
                config=cfg,
                median_s=med,
                ratio=med / base,
                times_s=ts,
                params=sum(p.numel() for p in model.parameters())))
    load = os.getloadavg() if hasattr(os, 'getloadavg') else None
    result = dict(
        env=dict(
            date=datetime.now(timezone.utc).isoformat(timespec='seconds'),
            torch=torch.__version__,
            device=str(device),
            threads=torch.get_num_threads(),
            load_avg_end=load),
        args=vars(args),
        batch_shapes=[list(t.shape[-2:]) for t in packed['inputs']],
        encoder_grid=grid,
        rows=rows)
    print(f'torch {torch.__version__} on {device}, '
          f'{torch.get_num_threads()} threads, load average {load}')
    print(f'batch of {args.batch} images {result["batch_shapes"]}, encoder '
          f'grid {grid}; median of {args.rounds} interleaved steps')
    print(f'{"config":<50}{"step s":>9}{"x":>7}')
    for row in rows:
        print(f'{row["config"]:<50}{row["median_s"]:>9.3f}'
              f'{row["ratio"]:>7.2f}')
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)
        print(f'wrote {args.out}')
    return result


if __name__ == '__main__':
    main()
