"""The long-sequence benchmark (``attention.py --long``): one attention
layer at L = 1050 ... 8192 tokens, the fused no-RPE path against the iRPE
rows and ViTDet's decomposed relative position, eager and compiled, the
tensor and resident peaks of each row measured in a fresh process."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import warnings
from typing import List, Tuple

import torch
import torch._dynamo
from attention_rows import _rpe_cfg
from bench_measure import (Row, clear_grads, fmt, padding_mask, peak_memory,
                           rss_peak, run_pass, time_once)
from torch import Tensor, nn

from mmpe.models.layers import ViTAttention, iRPEMultiheadAttention
from mmpe.utils.bench_env import (benchmark_device, benchmark_env, env_line,
                                  finish_env)
from mmpe.utils.benchmark_helpers import write_json

#: the command line that runs one memory row (``--long-memory-row``)
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'attention.py')
LONG_GRIDS = {1050: (25, 42), 4096: (64, 64), 8192: (64, 128)}
#: head configurations: (embed_dims, num_heads, layout)
HEAD_CFGS = {'vit-s': (384, 6, 'timm'), 'detr': (256, 8, 'mmcv')}
LONG_BASE = 'mmpe no RPE'
LONG_CTX = 'mmpe ctx product k'
#: variant -> PEAttention arguments (None: no RPE, the fused SDPA path);
#: names without a backend use the default attn_impl ('auto')
LONG_VARIANTS = {
    LONG_BASE: None,
    LONG_CTX: dict(mode='contextual', rpe_on='k'),
    'mmpe ctx product k (explicit)': dict(
        mode='contextual', rpe_on='k', attn_impl='explicit'),
    'mmpe ctx product k (chunked)': dict(
        mode='contextual', rpe_on='k', attn_impl='chunked'),
    'mmpe bias product k': dict(mode='bias', rpe_on='k'),
    'mmpe ctx product qkv': dict(mode='contextual', rpe_on='qkv'),
    # ViTDet's decomposed relative position, tables for the row's grid (the
    # ViT layout only: the DETR encoders have no such choice)
    'mmpe rel-pos': dict(rel_pos=True),
}
LONG_MODES = ('eager', 'compiled')
#: aims (fwd+bwd, x the fused no-RPE row of the same mode, dtype and run),
#: at every length: time (wall and process CPU time, both) and tensor peak
LONG_AIMS = dict(time=1.25, memory=1.3)


class LongCall(nn.Module):
    """One attention layer over the tokens of a feature map.

    ``forward(feat, mask)``: ``feat`` (B, C, h, w), ``mask`` (B, h, w) bool
    (True = padding) -> (B, h * w, C); the grid is read from the map's
    shape, so under ``torch.compile(dynamic=True)`` it is symbolic. The
    timm layout (:class:`ViTAttention`, the CPVT blocks) or mmcv's
    (:class:`iRPEMultiheadAttention`, the DETR encoders).
    """

    def __init__(self, module: nn.Module, layout: str) -> None:
        super().__init__()
        self.module, self.layout = module, layout

    def forward(self, feat: Tensor, mask: Tensor) -> Tensor:
        height, width = feat.shape[-2:]
        x = feat.flatten(2).transpose(1, 2)  # (B, C, h, w) -> (B, h*w, C)
        mask = mask.flatten(1)
        if self.layout == 'timm':
            return self.module(x, (height, width), key_padding_mask=mask)
        return self.module(x, key_padding_mask=mask,
                           spatial_shape=(height, width))


def long_module(variant: str, cfg: str, grid: Tuple[int, int]) -> LongCall:
    """The layer of a long-sequence row (seeded, Xavier iRPE tables; the
    decomposed relative position with truncated-normal tables made for
    ``grid``)."""
    dims, heads, layout = HEAD_CFGS[cfg]
    spec = LONG_VARIANTS[variant]
    kwargs = {}
    if spec is not None and spec.get('rel_pos'):
        kwargs = dict(rel_pos_cfg=dict(input_size=tuple(grid),
                                       init='trunc_normal'))
    elif spec is not None:
        spec = dict(spec)
        kwargs = dict(rpe_on=spec.pop('rpe_on'),
                      attn_impl=spec.pop('attn_impl', 'auto'),
                      rpe_cfg=dict(_rpe_cfg('bias' if spec['mode'] == 'bias'
                                            else 'ctx', 'product')))
    torch.manual_seed(0)
    if layout == 'timm':
        module = ViTAttention(dims, heads, **kwargs)
    else:
        module = iRPEMultiheadAttention(dims, heads, batch_first=True,
                                        **kwargs)
    return LongCall(module, layout)


class LongInputs:
    """Feature map (B, C, h, w), its mask (B, h, w) and the output
    gradient (B, h * w, C); with B > 1 the last image is padded by
    ``pad`` at the bottom / right (as mmdet pads a batch)."""

    def __init__(self, batch: int, grid: Tuple[int, int], dims: int,
                 pad: float, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(0)
        h, w = grid
        self.grid = grid
        self.x = torch.randn(batch, dims, h, w, generator=gen).to(device)
        self.grad = torch.randn(batch, h * w, dims, generator=gen).to(device)
        self.mask = padding_mask(batch, grid, pad).to(device)


def _long_call(m: nn.Module, x: Tensor, s: LongInputs) -> Tensor:
    return m(x, s.mask)


def long_batch(length: int, args: argparse.Namespace) -> int:
    """Batch of a length: ``--long-batch``, else 2 up to 2048 tokens (a
    DETR batch) and 1 above (one large image per step fits a CPU)."""
    if args.long_batch:
        return args.long_batch
    return 2 if length <= 2048 else 1


def long_rows(grid: Tuple[int, int], cfg: str, args: argparse.Namespace,
              device: torch.device) -> List[Row]:
    """Eager and compiled rows of every variant of one (grid, heads)."""
    length = grid[0] * grid[1]
    pattern = re.compile(args.variants) if args.variants else None
    rows = []
    for variant in LONG_VARIANTS:
        spec = LONG_VARIANTS[variant] or {}
        impl = spec.get('attn_impl')
        if variant not in (LONG_BASE, LONG_CTX) and pattern is not None \
                and not pattern.search(variant):
            continue
        if impl == 'explicit' and length > args.explicit_max_length:
            continue  # (B, H, L, L) buffers of GBs: opt-in
        if spec.get('rel_pos') and HEAD_CFGS[cfg][2] != 'timm':
            continue  # a ViT backbone's term; DETR encoders have none
        for mode in args.modes:
            call = long_module(variant, cfg, grid).to(device)
            module = call if mode == 'eager' else torch.compile(
                call, backend=args.backend, dynamic=True)
            row = Row(f'{variant} {mode}', module, _long_call, True, False)
            row.variant, row.mode = variant, mode
            rows.append(row)
    return rows


def memory_row(spec: dict) -> dict:
    """Peak memory of one row's fwd+bwd, in this (fresh) process: the
    tensor peak (:func:`peak_memory`) and the RSS peak (:func:`rss_peak`),
    after two warm-up runs (compilation, caches)."""
    if spec.get('threads'):
        torch.set_num_threads(spec['threads'])
    device = torch.device(spec['device'])
    length = spec['length']
    grid = tuple(spec['grid'])
    dims = HEAD_CFGS[spec['cfg']][0]
    s = LongInputs(spec['batch'], grid, dims, spec['pad'], device)
    call = long_module(spec['variant'], spec['cfg'], grid).to(device)
    module = call if spec['mode'] == 'eager' else torch.compile(
        call, backend=spec['backend'], dynamic=True)
    row = Row(spec['variant'], module, _long_call, True, False)
    with torch.autocast(device.type, dtype=torch.bfloat16,
                        enabled=spec.get('amp', False)):
        for _ in range(2):
            clear_grads(row)
            run_pass(row, s, 'fwd_bwd')
        clear_grads(row)
        rss = None if device.type == 'cuda' else rss_peak(
            lambda: run_pass(row, s, 'fwd_bwd'))
        tensors = peak_memory(row, s, 'fwd_bwd', device)
    return dict(length=length, tensor_peak=tensors, rss_peak=rss)


def _memory_subprocess(spec: dict) -> dict:
    """:func:`memory_row` in a fresh interpreter (so that one row's pages
    and caches do not hide another's)."""
    cmd = [sys.executable, SCRIPT, '--long-memory-row', json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith('MEMORY '):
            return json.loads(line[len('MEMORY '):])
    raise RuntimeError(f'memory row {spec} failed:\n{proc.stderr[-3000:]}')


def long_group(length: int, grid: Tuple[int, int], cfg: str,
               args: argparse.Namespace, device: torch.device) -> dict:
    """Time (interleaved rounds) and measure one (length, heads) group."""
    batch = long_batch(length, args)
    dims = HEAD_CFGS[cfg][0]
    s = LongInputs(batch, grid, dims, args.pad, device)
    rows = long_rows(grid, cfg, args, device)
    counters = torch._dynamo.utils.counters
    for row in rows:  # warm-up: compilation, plan caches
        counters.clear()
        row.first = time_once(row, s, 'fwd_bwd', device)
        row.graphs = int(counters['stats']['unique_graphs'])
        row.breaks = int(sum(counters['graph_break'].values()))
        if args.verbose:
            print(f'  {length} {cfg} {row.name}: first f+b {row.first:.1f} s',
                  flush=True)
    for row in rows:
        row.cpu = []
    for r in range(args.rounds):
        for row in rows:
            cpu0 = time.process_time()
            row.times['fwd_bwd'].append(time_once(row, s, 'fwd_bwd', device))
            row.cpu.append(time.process_time() - cpu0)
        if args.verbose:
            print(f'  round {r + 1}/{args.rounds} done', flush=True)
    if not args.no_memory:
        for row in rows:
            spec = dict(length=length, grid=list(grid), cfg=cfg,
                        variant=row.variant, mode=row.mode, batch=batch,
                        pad=args.pad, device=str(device),
                        backend=args.backend, amp=args.amp,
                        threads=torch.get_num_threads())
            mem = _memory_subprocess(spec)
            row.peak['fwd_bwd'] = mem['tensor_peak']
            row.rss = mem['rss_peak']
    recs = []
    for row in rows:
        ts = row.times['fwd_bwd']
        recs.append(dict(
            name=row.name, variant=row.variant, mode=row.mode,
            fwd_bwd_ms=statistics.median(ts) * 1e3,
            fwd_bwd_ms_all=[t * 1e3 for t in ts], first_s=row.first,
            cpu_ms=statistics.median(row.cpu) * 1e3,
            cpu_ms_all=[t * 1e3 for t in row.cpu],
            graphs=row.graphs, graph_breaks=row.breaks,
            peak_mb=(None if row.peak['fwd_bwd'] is None else
                     row.peak['fwd_bwd'] / 2**20),
            rss_mb=(None if getattr(row, 'rss', None) is None else
                    row.rss / 2**20)))
    by = {(r['variant'], r['mode']): r for r in recs}
    for r in recs:
        base = by.get((LONG_BASE, r['mode']))
        eager = by.get((r['variant'], 'eager'))
        r['x'] = r['fwd_bwd_ms'] / base['fwd_bwd_ms'] if base else None
        r['cpu_x'] = r['cpu_ms'] / base['cpu_ms'] if base else None
        # per round: rows are interleaved, each pair saw one background
        r['x_rounds'] = ([a / b for a, b in zip(r['fwd_bwd_ms_all'],
                                               base['fwd_bwd_ms_all'])]
                         if base else None)
        r['c_e'] = (r['fwd_bwd_ms'] / eager['fwd_bwd_ms']
                    if r['mode'] == 'compiled' and eager else None)
        r['cpu_c_e'] = (r['cpu_ms'] / eager['cpu_ms']
                        if r['mode'] == 'compiled' and eager else None)
        r['c_e_rounds'] = (
            [a / b for a, b in zip(r['fwd_bwd_ms_all'],
                                   eager['fwd_bwd_ms_all'])]
            if r['mode'] == 'compiled' and eager else None)
        for key in ('peak_mb', 'rss_mb'):
            ok = base and r[key] is not None and base[key]
            r[key.replace('_mb', '_x')] = r[key] / base[key] if ok else None
    return dict(length=length, grid=list(grid), cfg=cfg, batch=batch,
                rows=recs)


def long_aims(groups: List[dict]) -> List[dict]:
    """The aims on the default contextual-product-on-keys row (eager): time
    (met when both the wall-time and the process CPU-time ratio are within
    it: waiting for a core on a busy machine inflates only the first) and
    tensor peak; and compiled < eager for every iRPE row."""
    out = []
    for g in groups:
        by = {(r['variant'], r['mode']): r for r in g['rows']}
        ctx = by.get((LONG_CTX, 'eager'))
        tag = f"L={g['length']} {g['cfg']}"
        if ctx is not None:
            cpu = ctx.get('cpu_x')
            worst = max(ctx['x'], cpu if cpu is not None else ctx['x'])
            out.append(dict(aim=f'{tag} time <= {LONG_AIMS["time"]}x',
                            value=ctx['x'], cpu_value=cpu,
                            met=worst <= LONG_AIMS['time']))
            if ctx['peak_x'] is not None:
                out.append(dict(
                    aim=f'{tag} peak memory <= {LONG_AIMS["memory"]}x',
                    value=ctx['peak_x'],
                    met=ctx['peak_x'] <= LONG_AIMS['memory']))
        for r in g['rows']:
            if r['c_e'] is not None and r['variant'] != LONG_BASE:
                out.append(dict(aim=f'{tag} {r["variant"]} compiled < eager',
                                value=r['c_e'], met=r['c_e'] < 1))
    return out


def print_long(g: dict) -> None:
    print(f"\nL = {g['length']} ({g['grid'][0]}x{g['grid'][1]}), {g['cfg']} "
          f"({HEAD_CFGS[g['cfg']][1]} heads x "
          f"{HEAD_CFGS[g['cfg']][0] // HEAD_CFGS[g['cfg']][1]}), batch "
          f"{g['batch']}; x = / '{LONG_BASE}' of the same mode")
    head = (f'{"row":<38}{"f+b ms":>9}{"x":>6}{"c/e":>6}{"cpu x":>6}'
            f'{"cpu c/e":>8}{"peak MB":>8}{"x":>6}{"RSS MB":>8}{"x":>6}'
            f'{"1st s":>7}{"brk":>4}')
    print(head)
    print('-' * len(head))
    for r in g['rows']:
        print(f'{r["name"]:<38}{fmt(r["fwd_bwd_ms"], ".0f"):>9}'
              f'{fmt(r["x"], ".2f"):>6}{fmt(r["c_e"], ".2f"):>6}'
              f'{fmt(r["cpu_x"], ".2f"):>6}{fmt(r["cpu_c_e"], ".2f"):>8}'
              f'{fmt(r["peak_mb"], ".0f"):>8}{fmt(r["peak_x"], ".2f"):>6}'
              f'{fmt(r["rss_mb"], ".0f"):>8}{fmt(r["rss_x"], ".2f"):>6}'
              f'{r["first_s"]:>7.1f}{r["graph_breaks"]:>4}')


def long_main(args: argparse.Namespace) -> dict:
    """The long-sequence benchmark (``--long``)."""
    device = benchmark_device(args.device, args.threads)
    torch._dynamo.config.recompile_limit = 64
    results = dict(env=benchmark_env(device), args={
        k: v for k, v in vars(args).items() if k != 'grids'
    }, groups=[])
    print(f'{env_line(results["env"])}; median of {args.rounds} interleaved '
          'rounds' + ('; bf16 autocast' if args.amp else ''))
    grids = args.long_grids or [LONG_GRIDS[n] for n in args.lengths]
    for grid in grids:
        length = grid[0] * grid[1]
        for cfg in args.head_cfgs:
            with warnings.catch_warnings(), torch.autocast(
                    device.type, dtype=torch.bfloat16, enabled=args.amp):
                warnings.simplefilter('ignore')
                g = long_group(length, grid, cfg, args, device)
            results['groups'].append(g)
            print_long(g)
            if args.out:  # partial results survive an interruption
                write_json(args.out, results)
    results['aims'] = long_aims(results['groups'])
    print('\naims:')
    for a in results['aims']:
        cpu = (f" (CPU time {a['cpu_value']:.2f})"
               if a.get('cpu_value') is not None else '')
        print(f"  {a['aim']}: {a['value']:.2f}{cpu} "
              f"{'met' if a['met'] else 'NOT met'}")
    finish_env(results['env'])
    if args.out:
        write_json(args.out, results)
    return results
