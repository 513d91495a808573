"""The aims of the fused kernel on CUDA (issue 41), measured side by side in
one run: one attention core (:class:`~mmpe.models.layers.PEAttention`'s
``attend`` on projected q, k, v of shape (B, H, L, d)), forward +
backward, with

* ``'fused'``: the fused kernel of the device (Triton on CUDA, the C++
  kernel on CPU) running the relative position of a setting;
* ``'sdpa'``: the same core without any position encoding, which runs
  ``F.scaled_dot_product_attention`` (flash attention on CUDA where it
  applies: no mask, float16 / bfloat16) -- the reference of the aims;
* ``'explicit'``: the setting on the dense backend, (B, H, L, L) logits.

Settings: iRPE contextual product on k and on qk (piecewise index, ratio
1.9, shared heads, Xavier tables), ViTDet's decomposed relative position
(tables for the row's grid, truncated normal). Heads: ViT-S (6 x 64) and
DETR (8 x 32). Lengths: ``--lengths`` (the grids of ``attention.py
--long`` for 1050, 4096 and 8192; other lengths the most square grid).
Batch 2 up to 2048 tokens, 1 above (``--batch``); no padding (so that SDPA
may run flash attention).

dtypes: ``float32`` (TF32 off), and ``bfloat16`` as a bfloat16-autocast
training step sees the core: q, k, v in bfloat16 (the projections' output
under autocast), the tables float32 parameters, the call under
``torch.autocast(dtype=torch.bfloat16)``.

Time: the median of ``--rounds`` interleaved rounds after one warm-up
call, read with ``torch.cuda.Event`` on CUDA (``time.perf_counter`` on
CPU). Peak: ``torch.cuda.max_memory_allocated`` after a reset minus the
allocation before the call (on CPU the profiler's tensor peak,
``bench_measure.peak_memory``). Each aim (fused / SDPA <= 1.3 in time and
in peak) is met only where ``'fused'`` ran the fused kernel (no fallback).

    python tools/benchmark/fused_cuda.py --out work_dirs/bench/fused.json \\
        --report work_dirs/bench/fused.md
    python tools/benchmark/fused_cuda.py --device cpu --lengths 64 --rounds 1
"""
import argparse
import math
import os
import statistics
import time
import types
import warnings
from typing import Dict, List, Optional, Tuple

import torch
from attention_long import LONG_GRIDS
from attention_rows import _rpe_cfg
from bench_measure import Row, clear_grads, peak_memory, run_pass

from mmpe.models.layers import PEAttention
from mmpe.models.layers.attention.backends.choice import fused_backend
from mmpe.utils.bench_env import benchmark_device, benchmark_env, env_line
from mmpe.utils.benchmark_helpers import write_json

#: head configurations: name -> (embed_dims, num_heads)
HEADS = {'vit-s': (384, 6), 'detr': (256, 8)}
#: settings: name -> PEAttention arguments for a grid
SETTINGS = {
    'ctx product k': lambda grid: dict(
        rpe_on='k', rpe_cfg=_rpe_cfg('ctx', 'product')),
    'ctx product qk': lambda grid: dict(
        rpe_on='qk', rpe_cfg=_rpe_cfg('ctx', 'product')),
    'rel-pos': lambda grid: dict(rel_pos_cfg=dict(
        input_size=tuple(grid), init='trunc_normal')),
    # terms shared by every query (their gradient summed per block of the
    # kernel's programs): iRPE's bias and two offset biases (LookHere takes
    # the same path; its layouts need a multiple of 4 heads, ViT-S has 6)
    'bias product k': lambda grid: dict(
        rpe_on='k', rpe_cfg=_rpe_cfg('bias', 'product')),
    'log-cpb': lambda grid: dict(bias_cfg=dict(type='log-cpb',
                                               pretrained_size=tuple(grid))),
    'alibi-2d': lambda grid: dict(bias_cfg=dict(type='alibi-2d')),
}
DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16}
#: the backends measured of every setting (beside the SDPA reference)
IMPLS = ('fused', 'explicit')
#: the aims: fused / SDPA at most this, in time and in peak
AIMS = dict(time=1.3, peak=1.3)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', default='cuda',
                        help="'cuda' (default), 'cpu' (a smoke test with "
                        "tiny --lengths: 'fused' is the C++ kernel) or 'auto'")
    parser.add_argument('--lengths', type=int, nargs='+',
                        default=sorted(LONG_GRIDS))
    parser.add_argument('--heads', nargs='+', default=list(HEADS),
                        choices=list(HEADS))
    parser.add_argument('--settings', nargs='+', default=list(SETTINGS),
                        choices=list(SETTINGS))
    parser.add_argument('--dtypes', nargs='+', default=list(DTYPES),
                        choices=list(DTYPES))
    parser.add_argument('--batch', type=int, default=None,
                        help='default: 2 up to 2048 tokens, 1 above')
    parser.add_argument('--rounds', type=int, default=10,
                        help='interleaved timed rounds (median reported)')
    parser.add_argument('--warmup', type=int, default=2,
                        help='untimed calls of each row first (compilation, '
                        'caches)')
    parser.add_argument('--threads', type=int, default=None,
                        help='torch.set_num_threads (CPU)')
    parser.add_argument('--out', help='write the results as JSON here')
    parser.add_argument('--report', help='write the markdown table here')
    args = parser.parse_args(argv)
    for n in args.lengths:
        if n < 1:
            parser.error(f'--lengths {n}: lengths must be positive')
    if args.rounds < 1 or args.warmup < 1:
        parser.error(f'--rounds {args.rounds}, --warmup {args.warmup}: at '
                     'least 1 each')
    return args


def grid_of(length: int) -> Tuple[int, int]:
    """The (h, w) grid of ``length`` tokens: that of ``attention.py --long``
    where it has one, else the most square ``h <= w`` with ``h * w ==
    length``."""
    if length in LONG_GRIDS:
        return tuple(LONG_GRIDS[length])
    h = max(d for d in range(1, math.isqrt(length) + 1) if length % d == 0)
    return h, length // h


def batch_of(length: int, batch: Optional[int]) -> int:
    return batch if batch else (2 if length <= 2048 else 1)


class Timer:
    """Seconds of one call: CUDA events on CUDA, the wall clock on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, run) -> float:
        if self.device.type != 'cuda':
            t0 = time.perf_counter()
            run()
            return time.perf_counter() - t0
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        torch.cuda.synchronize(self.device)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize(self.device)
        return start.elapsed_time(end) / 1e3


def _call(module, x, s):
    """The core on the packed q, k, v ``x`` (3, B, H, L, d) of ``s``, under
    ``s.autocast`` (bfloat16) or none; the output in the gradient's dtype."""
    with torch.autocast(s.device.type, dtype=torch.bfloat16,
                        enabled=s.autocast):
        out = module.attend(x[0], x[1], x[2], s.grid)
    return out.to(s.grad.dtype)


def make_inputs(batch: int, heads: int, head_dim: int, grid, dtype,
                device: torch.device) -> types.SimpleNamespace:
    """Packed q, k, v and the output gradient of one group (seeded)."""
    gen = torch.Generator().manual_seed(0)
    n = grid[0] * grid[1]
    x = torch.randn(3, batch, heads, n, head_dim, generator=gen)
    grad = torch.randn(batch, heads, n, head_dim, generator=gen)
    return types.SimpleNamespace(
        x=x.to(device, dtype), grad=grad.to(device, dtype), grid=grid,
        device=device, autocast=dtype == torch.bfloat16)


def build_rows(dims: int, heads: int, grid, settings: List[str],
               device: torch.device) -> List[Row]:
    """The SDPA row, then ``setting (impl)`` of every setting and impl."""
    torch.manual_seed(0)
    rows = [Row('sdpa', PEAttention(dims, heads).to(device), _call, True,
                False)]
    for name in settings:
        for impl in IMPLS:
            torch.manual_seed(0)
            module = PEAttention(dims, heads, attn_impl=impl,
                                 **SETTINGS[name](grid))
            rows.append(Row(f'{name} ({impl})', module.to(device), _call,
                            True, False))
    return rows


def measure_group(rows: List[Row], s, rounds: int, warmup: int,
                  device: torch.device) -> Dict[str, dict]:
    """Warm up each row ``warmup`` times (recording its warnings: a
    fallback names itself there), time ``rounds`` interleaved rounds, then
    each peak. A row that raises (e.g. out of memory) is left out of the
    timing with its ``error``; the others go on."""
    timer = Timer(device)
    warned, errors = {}, {}
    for row in rows:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            try:
                for _ in range(warmup):
                    clear_grads(row)
                    run_pass(row, s, 'fwd_bwd')
            except Exception as e:  # one row's failure is a result too
                errors[row.name] = f'{type(e).__name__}: {e}'[:400]
                if device.type == 'cuda':
                    torch.cuda.empty_cache()
        warned[row.name] = sorted({str(w.message) for w in caught})
    ran = [row for row in rows if row.name not in errors]
    for _ in range(rounds):
        for row in ran:
            clear_grads(row)
            row.times['fwd_bwd'].append(
                timer(lambda: run_pass(row, s, 'fwd_bwd')))
    out = {}
    for row in rows:
        ts = row.times['fwd_bwd']
        peak = (None if row.name in errors else
                peak_memory(row, s, 'fwd_bwd', device))
        out[row.name] = dict(
            ms=statistics.median(ts) * 1e3 if ts else None,
            ms_all=[t * 1e3 for t in ts],
            peak_mb=None if peak is None else peak / 2**20,
            warnings=warned[row.name], error=errors.get(row.name))
    return out


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or not b else a / b


def setting_records(meas: Dict[str, dict], settings: List[str],
                    fused_name: str, head: dict) -> List[dict]:
    """One record per setting: the three columns, the ratios to SDPA and
    the aims (met: ratio <= limit and the fused kernel ran)."""
    sdpa = meas['sdpa']
    out = []
    for name in settings:
        fused, explicit = (meas[f'{name} ({impl})'] for impl in IMPLS)
        fell_back = [m for m in fused['warnings'] if 'falls back' in m]
        ratios = dict(time=_ratio(fused['ms'], sdpa['ms']),
                      peak=_ratio(fused['peak_mb'], sdpa['peak_mb']))
        rec = dict(head, setting=name, sdpa=sdpa, fused=fused,
                   explicit=explicit,
                   fused_backend=None if fell_back else fused_name,
                   fell_back=fell_back, ratios=ratios,
                   explicit_ratios=dict(
                       time=_ratio(explicit['ms'], sdpa['ms']),
                       peak=_ratio(explicit['peak_mb'], sdpa['peak_mb'])),
                   met={k: (v is not None and v <= AIMS[k]
                            and not fell_back) for k, v in ratios.items()})
        out.append(rec)
    return out


def run(args: argparse.Namespace) -> dict:
    device = benchmark_device(args.device, args.threads)
    if device.type == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    env = benchmark_env(
        device, triton=triton_version, cuda=torch.version.cuda,
        bf16='autocast(bfloat16), q/k/v bfloat16, tables float32',
        tf32=False, args={k: v for k, v in vars(args).items()})
    print(env_line(env) + f'; triton {triton_version}; CUDA '
          f'{torch.version.cuda}', flush=True)
    records = []
    for length in args.lengths:
        grid = grid_of(length)
        batch = batch_of(length, args.batch)
        for head_name in args.heads:
            dims, heads = HEADS[head_name]
            rows = build_rows(dims, heads, grid, args.settings, device)
            for dtype_name in args.dtypes:
                for row in rows:
                    row.times['fwd_bwd'].clear()
                s = make_inputs(batch, heads, dims // heads, grid,
                                DTYPES[dtype_name], device)
                meas = measure_group(rows, s, args.rounds, args.warmup,
                                     device)
                head = dict(length=length, grid=list(grid), batch=batch,
                            heads=head_name, num_heads=heads,
                            head_dim=dims // heads, dtype=dtype_name)
                for rec in setting_records(meas, args.settings,
                                           fused_backend(device.type), head):
                    records.append(rec)
                    print(table_line(rec), flush=True)
                del s
                if device.type == 'cuda':
                    torch.cuda.empty_cache()
    return dict(env=env, aims=AIMS, records=records)


def _fmt(v: Optional[float], spec: str) -> str:
    return '-' if v is None else format(v, spec)


def _met(rec: dict, key: str) -> str:
    if rec['fused']['error'] or rec['sdpa']['error']:
        return 'no (error)'
    if rec['fell_back']:
        return 'no (fell back)'
    return 'met' if rec['met'][key] else 'no'


TABLE_HEAD = [
    '| L (grid) | heads | dtype | setting | SDPA ms | fused ms | explicit '
    'ms | fused / SDPA time | time aim | SDPA MiB | fused MiB | explicit '
    'MiB | fused / SDPA peak | peak aim |',
    '|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|']


def table_line(rec: dict) -> str:
    """One markdown row of a record."""
    g = rec['grid']
    return (f"| {rec['length']} ({g[0]}x{g[1]}) | {rec['heads']} "
            f"({rec['num_heads']} x {rec['head_dim']}) | {rec['dtype']} | "
            f"{rec['setting']} | {_fmt(rec['sdpa']['ms'], '.2f')} | "
            f"{_fmt(rec['fused']['ms'], '.2f')} | "
            f"{_fmt(rec['explicit']['ms'], '.2f')} | "
            f"{_fmt(rec['ratios']['time'], '.2f')} | {_met(rec, 'time')} | "
            f"{_fmt(rec['sdpa']['peak_mb'], '.1f')} | "
            f"{_fmt(rec['fused']['peak_mb'], '.1f')} | "
            f"{_fmt(rec['explicit']['peak_mb'], '.1f')} | "
            f"{_fmt(rec['ratios']['peak'], '.2f')} | {_met(rec, 'peak')} |")


def report_markdown(result: dict) -> str:
    """The aims' table of a result, with its device and versions."""
    env = result['env']
    records = result['records']
    n_met = sum(all(r['met'].values()) for r in records)
    lines = [
        '# The fused kernel against SDPA without position encoding', '',
        f"{env['date']}; {env_line(env)}; triton {env['triton']}; CUDA "
        f"{env['cuda']}", '',
        f"One attention core, forward + backward, median of "
        f"{env['args']['rounds']} rounds after {env['args']['warmup']} "
        f"warm-up calls; bfloat16: {env['bf16']}; float32 "
        f"without TF32. Aims: fused / SDPA <= {AIMS['time']} in time and <= "
        f"{AIMS['peak']} in peak (allocated above the start of the call). "
        f'Both aims met in {n_met} of {len(records)} rows.', '',
        *TABLE_HEAD, *(table_line(r) for r in records), '']
    fallbacks = sorted({m for r in records for m in r['fell_back']})
    if fallbacks:
        lines += ['Fallbacks:', ''] + [f'- {m}' for m in fallbacks] + ['']
    errors = sorted({f"{r['length']} {r['heads']} {r['dtype']} {col}: "
                     f"{r[col]['error']}" for r in records
                     for col in ('sdpa', 'fused', 'explicit')
                     if r[col]['error']})
    if errors:
        lines += ['Errors:', ''] + [f'- {m}' for m in errors] + ['']
    return '\n'.join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = run(args)
    text = report_markdown(result)
    print('\n' + text)
    if args.out:
        write_json(args.out, result)
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)),
                    exist_ok=True)
        with open(args.report, 'w') as f:
            f.write(text)
        print(f'wrote {args.report}')
    return result


if __name__ == '__main__':
    main()
