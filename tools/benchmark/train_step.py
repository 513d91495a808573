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

``--dino`` compares mmdet's 4-scale DINO with ResNet-50 against DINO on the
ViTDet-layout ViT (``configs/dino-4scale_vit-*_vitdet_12e_coco.py``: ViT-B
with PEG, iRPE, RoPE-Mixed, the decomposed relative position, and ViT-S with
iRPE), each row in its own process (``--memory``), no ImageNet weights::

    python tools/benchmark/train_step.py --dino --image-size 1333x800 \
        --batch 2 --warmup 1 --rounds 3 --threads 1

Detectors with instance masks (Mask R-CNN) get masks in the batch.
``--image-size WxH`` makes every image that size (e.g. 1333x800, mmdet's
test size); ``--cfg-options`` apply to every config; ``--global-twin`` adds,
after each config whose backbone attends in windows (``window_size > 0``),
the same config with ``window_size=0`` (ViTDet's layout against global
attention, everything else equal); ``--windowed-twin`` adds, after each
config whose CPVT backbone attends globally, the same config in ViTDet's
layout (14 x 14 windows, global blocks 2, 5, 8, 11 of 12 or the same
quarters of another depth; without a class token, which windows refuse:
only the attention layout and that token differ); ``--amp-twin`` adds, after
each of those, the same model trained as ``tools/train.py --amp`` trains it
on a CPU (bf16 autocast around the forward: ``AutocastOptimWrapper``).
``--memory`` runs each config in its own
subprocess (one after the other, so not interleaved) and reports, beside
the median step time, the process's high-water resident memory (``VmHWM``)
and that above the resident size before the first step (``step MB``): CPU
memory, which PyTorch's allocator statistics do not give::

    # today's global DeiT-S-iRPE Mask R-CNN and its windowed twin, the
    # ViTDet-style ViT-S-iRPE Mask R-CNN and its global twin, at 1333 x 800
    python tools/benchmark/train_step.py \
        configs/mask-rcnn_deit-s-irpe_fpn_1x_coco.py \
        configs/mask-rcnn_vit-s-irpe_vitdet_lsj-100e_coco.py --global-twin \
        --windowed-twin --image-size 1333x800 --batch 2 --memory --warmup 1 \
        --rounds 2 --threads 1 --cfg-options model.backbone.init_cfg=None \
        model.data_preprocessor.batch_augments=None
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time
from typing import List, Optional, Tuple

import numpy as np
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))

from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs
from mmdet.utils import register_all_modules
from mmengine.config import Config, DictAction
from mmengine.hub import get_config
from mmengine.optim import build_optim_wrapper

from mmpe.utils.bench_env import (add_device_args, benchmark_device,
                                  benchmark_env, env_line, finish_env)
from mmpe.utils.benchmark_helpers import (parse_image_size, resident_mb,
                                          write_json)

CONFIGS = [
    'configs/quickstart/detr_r18_synthetic.py',
    'configs/quickstart/detr_irpe_r18_synthetic.py'
]
#: ``--dino``: mmdet's R50 DINO, then DINO on the ViTDet-layout ViT with each
#: encoding (one process per row; no ImageNet weights are loaded)
DINO_CONFIGS = [
    'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py',
    'configs/dino-4scale_vit-b-peg_vitdet_12e_coco.py',
    'configs/dino-4scale_vit-b-irpe_vitdet_12e_coco.py',
    'configs/dino-4scale_vit-b-rope-mixed_vitdet_12e_coco.py',
    'configs/dino-4scale_vit-b-rel-pos_vitdet_12e_coco.py',
    'configs/dino-4scale_vit-s-irpe_vitdet_12e_coco.py',
]


def make_batch(batch: int, min_size: int, max_size: int, num_classes: int,
               seed: int, with_mask: bool = False,
               image_size: Optional[Tuple[int, int]] = None) -> dict:
    """One packed batch (``inputs``, ``data_samples``) of varied sizes
    (every image ``image_size = (h, w)`` when given)."""
    rng = np.random.default_rng(seed)
    shapes = []
    for _ in range(batch):
        long = int(rng.integers(min_size, max_size + 1))
        short = max(8, int(long / rng.uniform(1.0, 3.0)))
        h, w = (long, short) if rng.random() < 0.5 else (short, long)
        shapes.append((3, *image_size) if image_size else (3, h, w))
    items = [int(n) for n in rng.integers(1, 6, size=batch)]
    torch.manual_seed(seed)
    return demo_mm_inputs(
        batch_size=batch,
        image_shapes=shapes,
        num_items=items,
        num_classes=num_classes,
        with_mask=with_mask)


def load_config(cfg_path: str, options: Optional[dict] = None) -> Config:
    """The config with ``options`` (``--cfg-options`` style) merged
    (``'mmdet::...'``: a config of the installed mmdet)."""
    if '::' in cfg_path:
        cfg = get_config(cfg_path)
    else:
        cfg = Config.fromfile(cfg_path)
    if options:
        cfg.merge_from_dict(options)
    return cfg


def build(cfg_path: str, device: torch.device,
          options: Optional[dict] = None):
    """Model (initialised, train mode) and optimiser wrapper of a config,
    and its number of classes."""
    cfg = load_config(cfg_path, options)
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(cfg.model))
    model.init_weights()
    model.to(device).train()
    optim = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    head = cfg.model.get('bbox_head') or cfg.model.roi_head.bbox_head
    return model, optim, head.num_classes


#: ViTDet's window size (14 x 14 tokens) for ``--windowed-twin``
TWIN_WINDOW = 14


def vitdet_global_blocks(depth: int) -> Tuple[int, ...]:
    """ViTDet's global blocks: the last of each quarter (2, 5, 8, 11 of
    12)."""
    quarter = max(1, depth // 4)
    return tuple(range(quarter - 1, depth, quarter))[:4]


def variants(args: argparse.Namespace) -> List[Tuple[str, str, dict]]:
    """(label, config path, options) of every model to compare, in order:
    each config, then its global twin with ``--global-twin`` and its
    windowed twin with ``--windowed-twin``."""
    out = []
    for cfg, path in zip(args.configs, _paths(args.configs)):
        options = dict(args.cfg_options or {})
        out.append((cfg, path, options))
        backbone = load_config(path, options).model.backbone
        windowed = bool(backbone.get('window_size', 0))
        if args.global_twin and windowed:
            out.append((f'{cfg} [global]', path,
                        dict(options, **{'model.backbone.window_size': 0})))
        if args.windowed_twin and not windowed and backbone.type == 'CPVT':
            depth = _cpvt_depth(backbone)
            out.append((f'{cfg} [windowed, no class token]', path,
                        dict(options, **{
                            'model.backbone.window_size': TWIN_WINDOW,
                            'model.backbone.global_blocks':
                            vitdet_global_blocks(depth),
                            'model.backbone.use_cls_token': False})))
    if args.amp_twin:
        out = [twin for variant in out for twin in (variant, amp_twin(variant))]
    return out


def amp_twin(variant: Tuple[str, str, dict]) -> Tuple[str, str, dict]:
    """The variant trained as ``tools/train.py --amp`` does on a CPU: its
    optimiser wrapper becomes an ``AutocastOptimWrapper`` (bf16 autocast
    around the forward, the same optimiser and clipping)."""
    label, path, options = variant
    return (f'{label} [bf16 autocast]', path,
            dict(options, **{'optim_wrapper.type': 'AutocastOptimWrapper',
                             'optim_wrapper.dtype': 'bfloat16'}))


def _cpvt_depth(backbone) -> int:
    from mmpe.models.backbones.cpvt import CPVT
    from mmpe.models.backbones.vit_args import parse_arch
    arch = parse_arch(backbone.get('arch', 'small'), CPVT.arch_zoo,
                      CPVT.essential_keys)
    return arch['depth']


def _paths(configs: List[str]) -> List[str]:
    # 'mmdet::...' names a config of the installed mmdet (Config.fromfile)
    return [
        c if os.path.isabs(c) or os.path.exists(c) or '::' in c else
        os.path.join(ROOT, c) for c in configs
    ]


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
    add_device_args(parser)
    parser.add_argument('--quick', action='store_true',
                        help='batch 2 of 64-96 px images, 1 warm-up, 2 rounds')
    parser.add_argument('--image-size', type=parse_image_size, default=None,
                        help='every image WIDTHxHEIGHT (e.g. 1333x800) '
                        'instead of random sizes')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='config options for every config')
    parser.add_argument('--global-twin', action='store_true',
                        help='also run each windowed config with '
                        'window_size=0')
    parser.add_argument('--windowed-twin', action='store_true',
                        help='also run each global CPVT config in ViTDet\'s '
                        'window layout (without a class token)')
    parser.add_argument('--amp-twin', action='store_true',
                        help='also run each variant under bf16 autocast '
                        '(tools/train.py --amp on a CPU)')
    parser.add_argument('--memory', action='store_true',
                        help='one subprocess per config: step time and '
                        'peak resident memory (not interleaved)')
    parser.add_argument('--dino', action='store_true',
                        help='the DINO rows: R50 DINO against DINO on the '
                        'ViTDet-layout ViT with each encoding (replaces the '
                        'configs; implies --memory and no ImageNet weights)')
    parser.add_argument('--child', type=int, default=None,
                        help=argparse.SUPPRESS)
    parser.add_argument('--out', help='write the results as JSON here')
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.min_size, args.max_size = 2, 64, 96
        args.warmup, args.rounds = 1, 2
    if args.dino:
        args.configs, args.memory = list(DINO_CONFIGS), True
        args.cfg_options = {'model.backbone.init_cfg': None,
                            **(args.cfg_options or {})}
    return args


def _batch_for(args, built) -> dict:
    """The benchmark batch for ``built`` (instance masks for a detector
    with a mask head)."""
    model, _, num_classes = built
    with_mask = getattr(model, 'with_mask', False)
    return make_batch(args.batch, args.min_size, args.max_size, num_classes,
                      args.seed, with_mask, args.image_size)


def _grid(model, packed: dict) -> Tuple[int, ...]:
    """The backbone's last feature grid (h, w) for this batch."""
    with torch.no_grad():
        data = model.data_preprocessor(packed, True)
        feats = model.extract_feat(data['inputs'])
    return tuple(int(s) for s in feats[-1].shape[-2:])


def _child_row(args, device) -> dict:
    """``--memory``: this process builds one variant and steps it."""
    label, path, options = variants(args)[args.child]
    built = build(path, device, options)
    packed = _batch_for(args, built)
    rss_before = resident_mb('VmRSS')
    ts = []
    for i in range(args.warmup + args.rounds):
        t = step(built[0], built[1], packed, device)
        if i >= args.warmup:
            ts.append(t)
    peak = resident_mb('VmHWM')
    return dict(times_s=ts, peak_mb=peak, step_mb=peak - rss_before,
                grid=_grid(built[0], packed),
                batch_shapes=[list(t.shape[-2:]) for t in packed['inputs']])


def _memory_rows(args, argv: List[str]) -> List[dict]:
    """``--memory``: one subprocess per variant (this script with ``argv``
    and ``--child``), one after the other."""
    import subprocess
    rows = []
    for index, (label, _, _) in enumerate(variants(args)):
        print(f'[train_step] {label} ...', flush=True)
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), *argv, '--child',
             str(index)], capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f'{label} failed:\n{proc.stderr[-3000:]}')
        rows.append(dict(config=label,
                         **json.loads(proc.stdout.strip().splitlines()[-1])))
    return rows


def main(argv: Optional[List[str]] = None) -> dict:
    args = parse_args(argv)
    register_all_modules(init_default_scope=True)
    import mmpe  # noqa: F401  (registers mmpe's modules)
    device = benchmark_device(args.device, args.threads)
    if args.child is not None:
        print(json.dumps(_child_row(args, device)))
        return {}
    env = benchmark_env(device)
    if args.memory:
        rows = _memory_rows(args, sys.argv[1:] if argv is None else argv)
        batch_shapes, grid = rows[0]['batch_shapes'], rows[0]['grid']
    else:
        labelled = variants(args)
        built = [build(path, device, opts) for _, path, opts in labelled]
        packed = _batch_for(args, built[0])
        times: List[List[float]] = [[] for _ in built]
        for _ in range(args.warmup):
            for model, optim, _ in built:
                step(model, optim, packed, device)
        for _ in range(args.rounds):  # interleaved
            for i, (model, optim, _) in enumerate(built):
                times[i].append(step(model, optim, packed, device))
        grid = _grid(built[0][0], packed)
        batch_shapes = [list(t.shape[-2:]) for t in packed['inputs']]
        rows = [
            dict(config=label, times_s=ts,
                 params=sum(p.numel() for p in model.parameters()))
            for (label, _, _), ts, (model, _, _) in zip(
                labelled, times, built)
        ]
    base = statistics.median(rows[0]['times_s'])
    for row in rows:
        row['median_s'] = statistics.median(row['times_s'])
        row['ratio'] = row['median_s'] / base
        if 'peak_mb' in row:
            row['peak_ratio'] = row['peak_mb'] / rows[0]['peak_mb']
            row['step_mb_ratio'] = row['step_mb'] / rows[0]['step_mb']
    result = dict(
        env=finish_env(env),
        args=vars(args),
        batch_shapes=batch_shapes,
        encoder_grid=grid,
        rows=rows)
    print(f'{env_line(env)}; {env["load_avg_end"]} at the end')
    print(f'batch of {args.batch} images {result["batch_shapes"]}, last '
          f'feature grid {grid}; median of {args.rounds} steps '
          f'({"one process per config" if args.memory else "interleaved"})')
    mem_head = f'{"peak MB":>10}{"x":>7}{"step MB":>10}{"x":>7}' \
        if args.memory else ''
    print(f'{"config":<60}{"step s":>9}{"x":>7}{mem_head}')
    for row in rows:
        mem = (f'{row["peak_mb"]:>10.0f}{row["peak_ratio"]:>7.2f}'
               f'{row["step_mb"]:>10.0f}{row["step_mb_ratio"]:>7.2f}'
               if args.memory else '')
        print(f'{row["config"]:<60}{row["median_s"]:>9.3f}'
              f'{row["ratio"]:>7.2f}{mem}')
    if args.out:
        write_json(args.out, result)
    return result


if __name__ == '__main__':
    main()
