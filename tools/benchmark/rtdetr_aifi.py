"""CPU latency of RT-DETR's AIFI per position encoding, side by side.

AIFI is the one transformer encoder layer of RT-DETR's hybrid encoder on
the stride-32 map (:class:`~mmpe.models.necks.RTDETRHybridEncoder`,
``neck.aifi``: flatten, the encoding, attention + FFN, back to a map). Each
row is AIFI with the released sizes (hidden 256, 8 heads, FFN 1024, one
layer) and one ``encoder_pe``, timed at each image size (``--sizes``,
default 640 x 640 and 1280 x 1280: grids 20 x 20 and 40 x 40), inference
(no gradient; ``--backward`` times forward + backward instead), batch
``--batch`` 1, ``attn_impl='auto'`` (mmpe's rule: the fused CPU kernel where
it takes the call). The rows run round-robin, ``--repeats`` rounds after
``--warmup`` untimed ones; a row's time is its median. Ratios (``x``)
divide by the ``sine`` row (the released AIFI) of the same size, measured
in the same run. Nothing is timed in a test; run this on a machine as
quiet as you can get and note its load (printed)::

    python tools/benchmark/rtdetr_aifi.py --threads 1 \\
        --out work_dirs/bench_rtdetr_aifi.json
"""
import argparse
import statistics
import time
from typing import Dict, List, Optional

import torch

from mmpe.models.necks import RTDETRHybridEncoder
from mmpe.utils.bench_env import (add_device_args, benchmark_device,
                                  benchmark_env, env_line, finish_env)
from mmpe.utils.benchmark_helpers import parse_image_size, write_json

#: the rows: name -> encoder_pe (the relative ones on top of the sine, as
#: a converted released checkpoint would get them; lookhere and the
#: normalised RoPE-Mixed without it, as their papers)
ENCODINGS: Dict[str, dict] = {
    'sine': dict(absolute='sine'),
    'none': dict(absolute='none'),
    'irpe-bias': dict(relative=dict(type='irpe', mode='bias', ratio=1.9)),
    'irpe-ctx': dict(relative=dict(type='irpe', mode='contextual',
                                   method='product', ratio=1.9, on='k')),
    'rope2d': dict(absolute='none', relative='rope2d'),
    'rope-mixed-norm': dict(absolute='none', relative=dict(
        type='rope-mixed', coords='normalized')),
    'log-cpb': dict(relative=dict(type='log-cpb', pretrained_size=(20, 20))),
    'alibi-2d': dict(relative='alibi-2d'),
    'lookhere': dict(absolute='none', relative=dict(type='lookhere')),
}
BASELINE = 'sine'


def build(encoding: str, device: torch.device) -> RTDETRHybridEncoder:
    """AIFI's neck alone: one level of stride 32, the released sizes."""
    torch.manual_seed(0)
    neck = RTDETRHybridEncoder(
        in_channels=[256], feat_strides=[32], hidden_dim=256,
        use_encoder_idx=[0], num_heads=8, dim_feedforward=1024,
        encoder_pe=ENCODINGS[encoding])
    neck.init_weights()
    return neck.to(device)


def time_once(neck: RTDETRHybridEncoder, feat: torch.Tensor,
              backward: bool) -> float:
    start = time.perf_counter()
    if backward:
        neck.zero_grad(set_to_none=True)
        neck.aifi(0, feat).square().mean().backward()
    else:
        with torch.no_grad():
            neck.aifi(0, feat)
    if feat.device.type == 'cuda':
        torch.cuda.synchronize()
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> dict:
    device = benchmark_device(args.device, args.threads)
    env = benchmark_env(device, batch=args.batch, backward=args.backward,
                        warmup=args.warmup, repeats=args.repeats)
    print(env_line(env))
    necks = {name: build(name, device) for name in args.encodings}
    for neck in necks.values():
        neck.train(args.backward)
    results = []
    for height, width in args.sizes:
        grid = (-(-height // 32), -(-width // 32))
        gen = torch.Generator().manual_seed(0)
        feat = torch.randn(args.batch, 256, *grid, generator=gen).to(device)
        times: Dict[str, List[float]] = {name: [] for name in necks}
        for i in range(args.warmup + args.repeats):
            for name, neck in necks.items():  # round-robin
                elapsed = time_once(neck, feat, args.backward)
                if i >= args.warmup:
                    times[name].append(elapsed)
        base = statistics.median(times[BASELINE]) if BASELINE in times \
            else None
        print(f'\n{width}x{height} (grid {grid[0]}x{grid[1]}):')
        print(f'  {"encoding":<16} {"ms":>9} {"x sine":>7}')
        for name, row in times.items():
            ms = 1000 * statistics.median(row)
            ratio = None if base is None else statistics.median(row) / base
            results.append(dict(size=[height, width], grid=list(grid),
                                encoding=name, ms=ms, ratio=ratio,
                                times_ms=[1000 * t for t in row]))
            shown = '' if ratio is None else f'{ratio:.2f}'
            print(f'  {name:<16} {ms:9.2f} {shown:>7}')
    return dict(env=finish_env(env), baseline=BASELINE, rows=results)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--sizes', nargs='+', type=parse_image_size,
                        default=[(640, 640), (1280, 1280)],
                        help='image sizes WIDTHxHEIGHT (default 640x640 '
                        '1280x1280)')
    parser.add_argument('--encodings', nargs='+', default=list(ENCODINGS),
                        choices=list(ENCODINGS))
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--backward', action='store_true',
                        help='time forward + backward (training mode)')
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--repeats', type=int, default=20)
    parser.add_argument('--out', help='write every row as JSON here')
    add_device_args(parser)
    args = parser.parse_args(argv)
    for name in ('batch', 'repeats'):
        if getattr(args, name) < 1:
            parser.error(f'--{name} must be >= 1, got {getattr(args, name)}')
    if args.warmup < 0:
        parser.error(f'--warmup must be >= 0, got {args.warmup}')
    return args


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    result = run(args)
    if args.out:
        write_json(args.out, result)


if __name__ == '__main__':
    main()
