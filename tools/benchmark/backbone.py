"""Time and peak memory of the plain-ViT backbone (CPVT) at detection sizes:
global attention against ViTDet's windows, for every position encoding.

For each ViT size (``--archs``: ViT-S, ViT-B) and image size (``--sizes``:
1024 x 1024, 1333 x 800; batch ``--batch`` 2), one training step of the
backbone alone, forward and backward (``loss = mean(out ** 2)``), in these
rows:

* ``global none``: global attention in every block, no position encoding
  (the attention is PyTorch's fused ``scaled_dot_product_attention``: the
  limit of what a global ViT costs);
* ``global <pe>``: global attention with each encoding of ``--encodings``;
* ``windowed none``: ViTDet's layout (``--window`` 14 x 14 windows; global
  attention in blocks 2, 5, 8, 11 of 12, i.e. every third block);
* ``windowed <pe>``: the windowed layout with each encoding;
* ``windows-only none`` / ``windows-only <pe>`` (``--layouts``, not by
  default): every block in windows, no global block; what an encoding
  costs inside windows alone.

``--dtypes float32 bfloat16`` runs every row also under bf16 autocast (the
forward in ``torch.autocast``, as ``tools/train.py --amp`` trains on a CPU);
ratios divide by the baseline of the same dtype, and ``x f32`` by the same
row in float32.

Encodings: ``peg`` (after block 0), ``learnable``, ``sine``, ``rope2d``,
``rope-mixed``, ``irpe`` (contextual product on keys, ratio 1.9, the iRPE
authors' DeiT setting) and ``rel-pos`` (ViTDet's decomposed relative
position; as in ViTDet, the global blocks' tables are made for the
benchmarked grid, the window blocks' for the window).

Every row runs in its own subprocess (``--child``), so that CPU memory is
seen: the child builds the backbone and the batch, reads its resident size
(``VmRSS``), runs ``--warmup`` then ``--repeats`` steps, and reports the
median step time and its high-water resident size (``VmHWM`` of
``/proc/self/status``, which counts only this process image). ``peak MB``
is that high-water mark; ``step MB`` is the high-water mark above the
resident size before the first step (activations, attention buffers,
gradients: what the step itself costs). Ratios (``x``) divide by the
``windowed none`` row of the same ViT and image size, measured in the same
run; ``x layout`` by the ``none`` row of the row's own layout. Nothing is timed in a test; run this on a machine as quiet as you can
get and note its load (printed)::

    # every row at full depth (12 blocks): hours on one CPU thread
    python tools/benchmark/backbone.py --out work_dirs/bench_backbone.json
    # three blocks (one window block pair and one global block), ViT-S
    python tools/benchmark/backbone.py --depth 3 --archs s \\
        --out work_dirs/bench_backbone_d3.json
    python tools/benchmark/backbone.py --quick   # small, to try the script

The children's numbers count their own process image only (``exec``
starts ``VmHWM`` afresh), not the parent that starts them.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))

from mmpe.utils.bench_env import benchmark_device, benchmark_env, finish_env
from mmpe.utils.benchmark_helpers import (parse_image_size, resident_mb,
                                          write_json)
ARCHS = {'s': 'small', 'b': 'base'}
ENCODINGS = ('peg', 'learnable', 'sine', 'rope2d', 'rope-mixed', 'irpe',
             'rel-pos')
LAYOUTS = ('global', 'windowed', 'windows-only')
DTYPES = ('float32', 'bfloat16')
BASELINE = 'windowed none'
#: aims on CPU (windowed layout): the encoding's step time and step memory
#: over windowed none
AIMS = {'irpe': dict(time=1.2, memory=1.3)}


def global_blocks(depth: int) -> Tuple[int, ...]:
    """ViTDet's global blocks scaled to ``depth``: every third block (2, 5,
    8, 11 of 12)."""
    return tuple(i for i in range(depth) if i % 3 == 2)


def row_name(layout: str, encoding: str) -> str:
    return f'{layout} {encoding}'


def child(args: argparse.Namespace) -> dict:
    """One row: build, step ``warmup + repeats`` times, report."""
    import torch

    from mmpe.models.backbones import CPVT

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    arch = dict(CPVT.arch_zoo[ARCHS[args.arch]])
    arch['depth'] = args.depth
    kwargs = dict(pos_encoding=args.encoding)
    if args.encoding == 'irpe':
        kwargs['rpe_cfg'] = dict(mode='contextual', method='product',
                                 ratio=1.9, rpe_on='k')
    height, width = args.size
    if args.encoding == 'rel-pos':
        kwargs['rel_pos_cfg'] = dict(input_size=(-(-height // 16),
                                                 -(-width // 16)))
    if args.layout == 'windowed':
        kwargs.update(window_size=args.window,
                      global_blocks=global_blocks(args.depth))
    elif args.layout == 'windows-only':
        kwargs.update(window_size=args.window)
    model = CPVT(arch=arch, **kwargs).train()
    x = torch.randn(args.batch, 3, height, width)
    autocast = torch.autocast(
        'cpu', dtype=torch.bfloat16, enabled=args.dtype == 'bfloat16')
    rss_before = resident_mb('VmRSS')
    times = []
    for i in range(args.warmup + args.repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        with autocast:
            out = model(x)[-1]
        out.float().square().mean().backward()
        elapsed = time.perf_counter() - start
        if i >= args.warmup:
            times.append(elapsed)
        del out
    peak = resident_mb('VmHWM')
    return dict(
        ms=1000 * statistics.median(times),
        times_ms=[1000 * t for t in times],
        peak_mb=peak,
        step_mb=peak - rss_before,
        grid=[-(-height // 16), -(-width // 16)],
        threads=torch.get_num_threads(),
        torch=torch.__version__)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--archs', nargs='+', default=None,
                        choices=list(ARCHS),
                        help='ViT-S and / or ViT-B (default both)')
    parser.add_argument('--sizes', nargs='+', type=parse_image_size,
                        default=None,
                        help='image sizes WIDTHxHEIGHT (default 1024x1024 '
                        '1333x800)')
    parser.add_argument('--encodings', nargs='+', default=list(ENCODINGS),
                        choices=list(ENCODINGS))
    parser.add_argument('--layouts', nargs='+', default=list(LAYOUTS[:2]),
                        choices=list(LAYOUTS))
    parser.add_argument('--depth', type=int, default=None,
                        help='blocks (default 12: the real ViT; 3: one '
                        'global block after two window blocks)')
    parser.add_argument('--dtypes', nargs='+', default=['float32'],
                        choices=list(DTYPES),
                        help='float32 and / or bfloat16 (bf16 autocast '
                        'around the forward)')
    parser.add_argument('--window', type=int, default=14)
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--threads', type=int, default=1,
                        help='torch threads of every row')
    parser.add_argument('--warmup', type=int, default=None,
                        help='untimed steps first (default 1)')
    parser.add_argument('--repeats', type=int, default=None,
                        help='timed steps (default 2)')
    parser.add_argument('--quick', action='store_true',
                        help='defaults of depth 3, ViT-S, 448x448, no '
                        'warm-up, 1 repeat: tries the script in a minute')
    parser.add_argument('--out', help='write every row as JSON here')
    # one row (run by the parent in a subprocess)
    parser.add_argument('--child', action='store_true',
                        help=argparse.SUPPRESS)
    parser.add_argument('--arch', choices=list(ARCHS), help=argparse.SUPPRESS)
    parser.add_argument('--size', type=parse_image_size,
                        help=argparse.SUPPRESS)
    parser.add_argument('--layout', choices=list(LAYOUTS),
                        help=argparse.SUPPRESS)
    parser.add_argument('--encoding', help=argparse.SUPPRESS)
    parser.add_argument('--dtype', choices=list(DTYPES), default='float32',
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = dict(depth=12, archs=['s', 'b'],
                    sizes=[(1024, 1024), (800, 1333)], warmup=1, repeats=2)
    if args.quick:
        defaults.update(depth=3, archs=['s'], sizes=[(448, 448)], warmup=0,
                        repeats=1)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ('depth', 'window', 'batch', 'threads', 'repeats'):
        if getattr(args, name) < 1:
            parser.error(f'--{name} must be >= 1, got {getattr(args, name)}')
    if args.warmup < 0:
        parser.error(f'--warmup must be >= 0, got {args.warmup}')
    return args


def _run_row(args: argparse.Namespace, arch: str, size: Tuple[int, int],
             layout: str, encoding: str, dtype: str) -> dict:
    height, width = size
    cmd = [
        sys.executable, os.path.abspath(__file__), '--child', '--arch', arch,
        '--size', f'{width}x{height}', '--layout', layout, '--encoding',
        encoding, '--dtype', dtype, '--depth', str(args.depth),
        '--window', str(args.window),
        '--batch', str(args.batch), '--threads', str(args.threads),
        '--warmup', str(args.warmup), '--repeats', str(args.repeats)
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        return dict(error=proc.stderr.strip().splitlines()[-1:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or not b else a / b


def summarise(rows: List[dict]) -> List[dict]:
    """Ratios of time and memory to ``windowed none`` of the same ViT,
    image size and dtype, and to the same row in float32 (``x_time_f32``);
    the aims of :data:`AIMS` checked where both rows exist."""
    by_key = {(r['arch'], tuple(r['size']), r['dtype'], r['row']): r
              for r in rows}
    for r in rows:
        key = (r['arch'], tuple(r['size']), r['dtype'])
        base = by_key.get((*key, BASELINE), {})
        f32 = by_key.get((r['arch'], tuple(r['size']), 'float32', r['row']),
                         {})
        r['x_time_f32'] = _ratio(r.get('ms'), f32.get('ms'))
        r['x_peak_mb_f32'] = _ratio(r.get('peak_mb'), f32.get('peak_mb'))
        r['x_time'] = _ratio(r.get('ms'), base.get('ms'))
        r['x_step_mb'] = _ratio(r.get('step_mb'), base.get('step_mb'))
        r['x_peak_mb'] = _ratio(r.get('peak_mb'), base.get('peak_mb'))
        layout, encoding = r['row'].split()
        own = by_key.get((*key, row_name(layout, 'none')), {})
        r['x_time_layout'] = _ratio(r.get('ms'), own.get('ms'))
        r['x_step_mb_layout'] = _ratio(r.get('step_mb'), own.get('step_mb'))
        if layout == 'windowed' and encoding in AIMS:
            aim = AIMS[encoding]
            if r['x_time'] is not None and r['x_step_mb'] is not None:
                r['aim'] = dict(
                    aim, met=r['x_time'] <= aim['time']
                    and r['x_step_mb'] <= aim['memory'])
    return rows


def _fmt(value: Optional[float], spec: str) -> str:
    return '-' if value is None else format(value, spec)


def print_table(rows: List[dict]) -> None:
    head = (f'{"ViT":<4}{"image":>10} {"dtype":<9}{"row":<24}{"grid":>9}'
            f'{"ms":>10}{"x":>7}{"step MB":>10}{"x":>7}{"peak MB":>10}'
            f'{"x":>7}{"x layout (ms, step MB)":>24}{"x f32 (ms, peak)":>18}')
    print(head)
    for r in rows:
        size = f'{r["size"][1]}x{r["size"][0]}'
        if 'error' in r:
            print(f'{r["arch"]:<4}{size:>10} {r["dtype"]:<9}{r["row"]:<24} '
                  'failed: '
                  f'{r["error"]}')
            continue
        grid = f'{r["grid"][0]}x{r["grid"][1]}'
        aim = ''
        if 'aim' in r:
            aim = (f'  aim <= {r["aim"]["time"]}x time, '
                   f'<= {r["aim"]["memory"]}x step MB: '
                   f'{"met" if r["aim"]["met"] else "NOT met"}')
        own = (f'{_fmt(r["x_time_layout"], ".2f")}, '
               f'{_fmt(r["x_step_mb_layout"], ".2f")}')
        f32 = (f'{_fmt(r["x_time_f32"], ".2f")}, '
               f'{_fmt(r["x_peak_mb_f32"], ".2f")}')
        print(f'{r["arch"]:<4}{size:>10} {r["dtype"]:<9}{r["row"]:<24}'
              f'{grid:>9}{r["ms"]:>10.0f}{_fmt(r["x_time"], ".2f"):>7}'
              f'{r["step_mb"]:>10.0f}{_fmt(r["x_step_mb"], ".2f"):>7}'
              f'{r["peak_mb"]:>10.0f}{_fmt(r["x_peak_mb"], ".2f"):>7}'
              f'{own:>24}{f32:>18}{aim}')


def main(argv: Optional[List[str]] = None) -> Dict:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return {}
    # the children's thread count here too, so that the record says it
    env = benchmark_env(benchmark_device('cpu', args.threads))
    rows = []
    for arch in args.archs:
        for size in args.sizes:
            names = [(dtype, layout, enc) for dtype in args.dtypes
                     for layout in args.layouts
                     for enc in ('none', *args.encodings)]
            for dtype, layout, encoding in names:
                name = row_name(layout, encoding)
                print(f'[backbone] ViT-{arch.upper()} {size[1]}x{size[0]} '
                      f'{dtype} {name} ...', flush=True)
                rec = _run_row(args, arch, size, layout, encoding, dtype)
                rows.append(dict(arch=arch, size=list(size), dtype=dtype,
                                 row=name, **rec))
    summarise(rows)
    result = dict(
        env=finish_env(env),
        args={k: v for k, v in vars(args).items()
              if k not in ('child', 'arch', 'size', 'layout', 'encoding',
                           'dtype')},
        rows=rows)
    print(f'depth {args.depth}, window {args.window}, global blocks '
          f'{global_blocks(args.depth)}, batch {args.batch}, '
          f'{args.threads} thread(s), median of {args.repeats} step(s) after '
          f'{args.warmup} warm-up; load average {env["load_avg_start"]} at '
          f'the start, {env["load_avg_end"]} at the end')
    print_table(rows)
    if args.out:
        write_json(args.out, result)
    return result


if __name__ == '__main__':
    main()
