"""Eager against ``torch.compile`` for DETR encoder attention (issue 17).

Two parts, one run:

**Attention** (``layer``, ``encoder``): one encoder self-attention layer and a
6-layer DETR encoder at a DETR feature grid (25 x 42 = an 800 x 1333 image at
stride 32), batch 2, 256 dims, 8 heads, the second image padded at the
bottom / right (the inputs, timing and medians of
``tools/benchmark/attention.py``: ``bench_measure.py``). Variants:

* ``mmcv MHA`` - mmcv's ``MultiheadAttention`` / mmdet's
  ``DetrTransformerEncoder`` (plain attention, the baseline);
* ``mmpe no RPE`` - :class:`iRPEMultiheadAttention` with ``rpe_cfg=None`` /
  mmpe's iRPE DETR encoder built with it;
* ``mmpe ctx product k`` - contextual iRPE, product method, on keys, the
  default backend (``attn_impl='auto'``: chunked from 1024 tokens on, so
  at 25 x 42);
* ``mmpe ctx product k (explicit)`` - the same with ``attn_impl='explicit'``;
* ``mmpe bias product k`` - bias iRPE, product method, on keys (default);
* ``mmpe RoPE-Mixed`` - RoPE-Mixed (Heo et al., ECCV 2024) on q and k.

each run ``eager`` and ``compiled`` (``torch.compile(call, dynamic=True,
backend=--backend)``). The compiled callable is a small module taking the
feature map ``(B, C, h, w)``, its positions ``(B, C, h, w)`` and padding
mask ``(B, h, w)``: it flattens them to tokens and reads the grid from the
map's shape, so the grid reaches mmpe as symbolic sizes (as in a detector),
not as Python constants. The eager row runs the same module uncompiled.

Per row: the first fwd+bwd and the first forward (``compile s``: for a
compiled row the tracing and compilation, for an eager row the cache
warm-up), the graphs dynamo compiled and its graph breaks, the largest
difference to the eager output; then medians over ``--rounds`` round-robin
rounds (every row once per round) of fwd+bwd (``out = call(...)`` then
``out.backward(g)``) and of the forward under ``torch.no_grad()``. Ratios:
``c/e`` is compiled / eager of the same variant, ``x`` the row over compiled
``mmcv MHA`` of the same level. Aims (issue 17, fwd+bwd, reported as PASS /
FAIL per level): compiled ``ctx product k`` faster than eager, and at most
1.5 x compiled ``mmcv MHA``.

**Train step** (``train_step``, ``compiled_train_step.py``): the quick-start
DETR-iRPE (``configs/quickstart/detr_irpe_r18_synthetic.py``)
``model.train_step``
eager against ``torch.compile(model.train_step)`` as MMEngine's runner does
for ``compile=True`` (``Runner._maybe_compile``: default arguments, i.e.
inductor and ``dynamic=None``; ``--backend`` changes the backend), built as
``tools/benchmark/train_step.py`` builds it (the parameter groups made plain
dicts, as ``tools/train.py``'s ``PlainParamGroupsHook`` does), on two batches of different
image sizes (so the second size recompiles with dynamic shapes). Reported:
the first step of each model on each batch (compile and recompile), then the
median per batch of ``--train-rounds`` round-robin steps after
``--train-warmup`` warm-up steps, and dynamo's graphs and graph breaks. If
the compiled step raises (MMEngine does not catch compile errors), the error
is recorded and the compiled model is rebuilt and run with
``torch._dynamo.config.suppress_errors=True`` (frames that fail to compile
run eagerly), labelled ``compiled (suppress_errors)``.

Torch threads and the load average at start and end are recorded (the
machine may be shared). Commands::

    python tools/benchmark/compiled.py --cold-cache \\
        --out work_dirs/bench/compiled.json
    python tools/benchmark/compiled.py --parts layer --variants 'ctx'
    python tools/benchmark/compiled.py --quick   # seconds, backend aot_eager
"""
import argparse
import contextlib
import re
import warnings
from typing import Dict, List, Optional

import attention_rows as rows_lib
import bench_measure as bench
import torch
import torch._dynamo
import torch._inductor.config
from compiled_train_step import MODES, train_step_part
from mmcv.cnn.bricks.transformer import MultiheadAttention
from mmdet.models.layers import DetrTransformerEncoder
from torch import Tensor, nn

from mmpe.models.detectors import iRPEDetrTransformerEncoder
from mmpe.models.layers import iRPEMultiheadAttention
from mmpe.utils.bench_env import (add_device_args, benchmark_device,
                                  benchmark_env, env_line, finish_env)
from mmpe.utils.benchmark_helpers import write_json

BASELINE = rows_lib.BASELINE  # 'mmcv MHA'
CTX = 'mmpe ctx product k'
#: variant -> iRPEMultiheadAttention's arguments (None: mmcv / mmdet)
VARIANTS = {
    BASELINE: None,
    'mmpe no RPE': dict(rpe_cfg=None),
    CTX: dict(rpe_cfg=rows_lib._rpe_cfg('ctx', 'product'), rpe_on='k'),
    'mmpe ctx product k (explicit)': dict(
        rpe_cfg=rows_lib._rpe_cfg('ctx', 'product'),
        rpe_on='k',
        attn_impl='explicit'),
    'mmpe bias product k': dict(
        rpe_cfg=rows_lib._rpe_cfg('bias', 'product'), rpe_on='k'),
    'mmpe RoPE-Mixed': dict(rpe_cfg=None, rope_cfg=dict(type='rope-mixed')),
}
PARTS = ('layer', 'encoder', 'train_step')
BACKENDS = ('inductor', 'aot_eager', 'eager')
#: compiled ctx-k fwd+bwd at most this times compiled mmcv MHA fwd+bwd
AIM_VS_MHA = 1.5
TRAIN_CONFIG = 'configs/quickstart/detr_irpe_r18_synthetic.py'
# the round-robin keeps every compiled row's graphs (grad and no-grad) on
# GridCall.forward's one code object: more than dynamo's default limit of 8
RECOMPILE_LIMIT = 64


class GridCall(nn.Module):
    """An attention layer or encoder over the tokens of a feature map.

    Args:
        module (nn.Module): Called as ``module(tokens, query_pos=...,
            key_padding_mask=...)`` (mmcv's and mmdet's signature), plus
            ``spatial_shape=(h, w)`` if ``spatial``.
        spatial (bool): Whether ``module`` takes the grid (mmpe's).

    ``forward(feat, pos, mask)``: ``feat`` and ``pos`` (B, C, h, w), ``mask``
    (B, h, w) (True = padding) -> (B, h * w, C). The grid is read from
    ``feat.shape``, so under ``torch.compile(dynamic=True)`` it is symbolic.
    """

    def __init__(self, module: nn.Module, spatial: bool) -> None:
        super().__init__()
        self.module, self.spatial = module, spatial

    def forward(self, feat: Tensor, pos: Tensor, mask: Tensor) -> Tensor:
        height, width = feat.shape[-2:]
        tokens = feat.flatten(2).transpose(1, 2)  # (B, h * w, C)
        kwargs = dict(spatial_shape=(height, width)) if self.spatial else {}
        return self.module(
            tokens,
            query_pos=pos.flatten(2).transpose(1, 2),
            key_padding_mask=mask.flatten(1),
            **kwargs)


class GridInputs(bench.Inputs):
    """:class:`attention.Inputs` as maps: ``x`` and ``pos`` (B, C, h, w),
    ``mask`` (B, h, w); ``grad`` stays (B, h * w, C), the output's shape."""

    def __init__(self, batch: int, grid, dims: int, pad: float,
                 device: torch.device) -> None:
        super().__init__(batch, grid, dims, pad, device)
        h, w = grid
        self.x = self.x.transpose(1, 2).reshape(batch, dims, h, w).contiguous()
        self.pos = self.pos.transpose(1, 2).reshape(batch, dims, h,
                                                    w).contiguous()
        self.mask = self.mask.view(batch, h, w)


def _grid_call(m: nn.Module, x: Tensor, s: GridInputs) -> Tensor:
    return m(x, s.pos, s.mask)


def _module(name: str, level: str, args: argparse.Namespace) -> nn.Module:
    """The layer or encoder of a variant."""
    attn = VARIANTS[name]
    if level == 'layer':
        common = rows_lib.layer_kwargs(args)
        if attn is None:
            return MultiheadAttention(args.dims, args.heads, **common)
        return iRPEMultiheadAttention(args.dims, args.heads, **common, **attn)
    n = args.encoder_layers
    if attn is None:
        return DetrTransformerEncoder(
            num_layers=n, layer_cfg=rows_lib.encoder_layer_cfg(args))
    return iRPEDetrTransformerEncoder(
        num_layers=n, layer_cfg=rows_lib.encoder_layer_cfg(args, **attn))


def row_name(variant: str, level: str, mode: str) -> str:
    return f'{variant}{" encoder" if level == "encoder" else ""} {mode}'


def build_rows(level: str, args: argparse.Namespace,
               device: torch.device) -> List:
    """Eager and compiled rows of every variant, the same module in both."""
    pattern = re.compile(args.variants) if args.variants else None
    rows = []
    for variant in VARIANTS:
        # the baseline and ctx-k always run: the ratios and aims need them
        if (pattern is not None and variant not in (BASELINE, CTX)
                and not pattern.search(variant)):
            continue
        torch.manual_seed(0)
        call = GridCall(_module(variant, level, args),
                        VARIANTS[variant] is not None).to(device)
        compiled = torch.compile(call, backend=args.backend, dynamic=True)
        for mode, module in zip(MODES, (call, compiled)):
            row = bench.Row(row_name(variant, level, mode), module,
                            _grid_call, 'fwd_bwd' in args.passes,
                            'fwd' in args.passes)
            row.variant, row.mode = variant, mode
            rows.append(row)
    return rows


def warm_up(rows: List, s: GridInputs, device: torch.device) -> None:
    """First fwd+bwd and forward of every row (compilation for compiled
    rows), its graphs and graph breaks, and compiled == eager."""
    counters = torch._dynamo.utils.counters
    eager_out = {}
    for row in rows:
        counters.clear()
        row.first = {}
        for what in ('fwd_bwd', 'fwd'):
            if getattr(row, 'backward' if what == 'fwd_bwd' else 'forward'):
                row.first[what] = bench.time_once(row, s, what, device)
        row.graphs = int(counters['stats']['unique_graphs'])
        row.breaks = int(sum(counters['graph_break'].values()))
        with torch.no_grad():
            out = _grid_call(row.module, s.x, s)
        if row.mode == 'eager':
            eager_out[row.variant] = out
            row.max_diff = 0.0
        else:
            row.max_diff = float(
                (out - eager_out[row.variant]).abs().max())


def summarise(rows: List, level: str) -> List[dict]:
    """Medians, ratios to compiled mmcv MHA, compiled / eager."""
    recs = bench.summarise(rows, row_name(BASELINE, level, 'compiled'))
    by = {r['name']: r for r in recs}
    for row, rec in zip(rows, recs):
        eager = by[row_name(row.variant, level, 'eager')]
        rec.update(
            variant=row.variant,
            mode=row.mode,
            first_fwd_bwd_s=row.first.get('fwd_bwd'),
            first_fwd_s=row.first.get('fwd'),
            graphs=row.graphs,
            graph_breaks=row.breaks,
            max_abs_diff_vs_eager=row.max_diff)
        for what in ('fwd_bwd', 'fwd'):
            med, emed = rec[f'{what}_ms'], eager[f'{what}_ms']
            rec[f'{what}_compiled_over_eager'] = (
                med / emed if row.mode == 'compiled' and med and emed else
                None)
        for key in ('fwd_bwd_peak_mb', 'fwd_bwd_mem_ratio', 'fwd_peak_mb',
                    'fwd_mem_ratio'):
            rec.pop(key)  # not measured here
    return recs


def check_aims(recs: List[dict], level: str) -> Dict[str, dict]:
    """The two aims of issue 17 on one level (fwd+bwd medians)."""
    by = {r['name']: r for r in recs}
    ctx_c = by[row_name(CTX, level, 'compiled')]
    ctx_e = by[row_name(CTX, level, 'eager')]
    mha_c = by[row_name(BASELINE, level, 'compiled')]
    if ctx_c['fwd_bwd_ms'] is None:
        return {}
    # per-round ratios too: rows are interleaved, each pair saw one load
    pairs = zip(ctx_c['fwd_bwd_ms_all'], ctx_e['fwd_bwd_ms_all'])
    return {
        'compiled_faster_than_eager':
        dict(
            compiled_ms=ctx_c['fwd_bwd_ms'],
            eager_ms=ctx_e['fwd_bwd_ms'],
            ratio=ctx_c['fwd_bwd_ms'] / ctx_e['fwd_bwd_ms'],
            round_ratios=[c / e for c, e in pairs],
            met=ctx_c['fwd_bwd_ms'] < ctx_e['fwd_bwd_ms']),
        'within_of_compiled_mha':
        dict(
            compiled_ms=ctx_c['fwd_bwd_ms'],
            mha_compiled_ms=mha_c['fwd_bwd_ms'],
            ratio=ctx_c['fwd_bwd_ms'] / mha_c['fwd_bwd_ms'],
            limit=AIM_VS_MHA,
            met=ctx_c['fwd_bwd_ms'] <= AIM_VS_MHA * mha_c['fwd_bwd_ms']),
    }


def print_table(title: str, recs: List[dict]) -> None:
    print(f'\n{title}')
    head = (f'{"row":<38}{"fwd+bwd ms":>11}{"x":>6}{"c/e":>6}{"fwd ms":>9}'
            f'{"x":>6}{"c/e":>6}{"1st f+b s":>10}{"1st fwd s":>10}'
            f'{"graphs":>7}{"breaks":>7}{"max diff":>9}')
    print(head)
    print('-' * len(head))
    for r in recs:
        print(f'{r["name"]:<38}'
              f'{bench.fmt(r["fwd_bwd_ms"], ".1f"):>11}'
              f'{bench.fmt(r["fwd_bwd_time_ratio"], ".2f"):>6}'
              f'{bench.fmt(r["fwd_bwd_compiled_over_eager"], ".2f"):>6}'
              f'{bench.fmt(r["fwd_ms"], ".1f"):>9}'
              f'{bench.fmt(r["fwd_time_ratio"], ".2f"):>6}'
              f'{bench.fmt(r["fwd_compiled_over_eager"], ".2f"):>6}'
              f'{bench.fmt(r["first_fwd_bwd_s"], ".2f"):>10}'
              f'{bench.fmt(r["first_fwd_s"], ".2f"):>10}'
              f'{r["graphs"]:>7}{r["graph_breaks"]:>7}'
              f'{r["max_abs_diff_vs_eager"]:>9.1e}')


def attention_part(level: str, args: argparse.Namespace,
                   device: torch.device) -> dict:
    """Build, compile, time and summarise one level's rows."""
    inputs = GridInputs(args.batch, args.grid, args.dims, args.pad, device)
    # the first calls compile from an empty cache: graphs that earlier work
    # in this process left (another level, a caller's) neither count nor run
    torch._dynamo.reset()
    rows = build_rows(level, args, device)
    timing = argparse.Namespace(
        passes=args.passes, rounds=args.rounds, verbose=args.verbose,
        no_memory=True)
    with warnings.catch_warnings(), torch._dynamo.config.patch(
            recompile_limit=RECOMPILE_LIMIT):
        warnings.simplefilter('ignore')
        warm_up(rows, inputs, device)
        bench.measure(rows, inputs, timing, device)
    recs = summarise(rows, level)
    h, w = args.grid
    layers = args.encoder_layers if level == 'encoder' else 1
    print_table(
        f'{level} @ {h}x{w} (L = {h * w}, {layers} layer(s)); x = over '
        f'{row_name(BASELINE, level, "compiled")!r}, c/e = compiled / eager',
        recs)
    res = dict(rows=recs, aims=check_aims(recs, level))
    for name, aim in res['aims'].items():
        what = ('compiled < eager' if name == 'compiled_faster_than_eager'
                else f'compiled <= {AIM_VS_MHA} x compiled {BASELINE}')
        base = aim.get('eager_ms', aim.get('mha_compiled_ms'))
        print(f'{"PASS" if aim["met"] else "FAIL"}: {level} {CTX} fwd+bwd '
              f'{what}: {aim["compiled_ms"]:.1f} ms vs {base:.1f} ms '
              f'(ratio {aim["ratio"]:.2f})')
    if args.profile:
        prof_rows = [r for r in rows if re.search(args.profile, r.name)]
        res['profile'] = bench.profile_rows(prof_rows, inputs, '.', device)
    return res


def _prewarm(backend: str) -> None:
    """A throwaway compiled fwd+bwd: dynamo's and the backend's one-time
    imports and set-up, so that no row's compile time includes them."""

    def fn(x: Tensor) -> Tensor:
        return (x.sin() * x.shape[0]).sum()

    x = torch.randn(4, 3, requires_grad=True)
    torch.compile(fn, backend=backend, dynamic=True)(x).backward()


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--parts', nargs='+', default=list(PARTS),
                        choices=PARTS)
    parser.add_argument('--grid', type=bench.parse_grid, default=(25, 42),
                        help='feature grid HxW (DETR at 800x1333: 25x42)')
    bench.add_layer_args(parser)
    parser.add_argument(
        '--variants', default=None,
        help=f'regex: only these variants ({BASELINE!r} and {CTX!r} always '
        'run)')
    parser.add_argument(
        '--backend', default=None, choices=BACKENDS,
        help="torch.compile backend (default 'inductor'; 'aot_eager' with "
        '--quick)')
    parser.add_argument(
        '--cold-cache', action='store_true',
        help="disable inductor's on-disk caches, so the compile times are "
        'those of a first run')
    parser.add_argument('--train-config', default=TRAIN_CONFIG)
    parser.add_argument('--train-batch', type=int, default=8,
                        help='images a batch (the quick-start batch size)')
    parser.add_argument('--min-size', type=int, default=128)
    parser.add_argument('--max-size', type=int, default=256)
    parser.add_argument('--train-seeds', type=int, nargs=2, default=[0, 1],
                        help='seeds of the two batches (different sizes)')
    parser.add_argument('--train-warmup', type=int, default=1,
                        help='untimed steps per batch after the first')
    parser.add_argument('--train-rounds', type=int, default=5)
    add_device_args(parser)
    parser.add_argument(
        '--quick', action='store_true',
        help='seconds (tests): 4x5 grid, 32 dims, 4 heads, 1-layer encoder, '
        "1 round, backend 'aot_eager' unless --backend; train step on 2 "
        'images of 64-96 px, no warm-up, 1 round')
    bench.add_report_args(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.grid, args.dims, args.heads = (4, 5), 32, 4
        args.rounds, args.encoder_layers = 1, 1
        args.train_batch, args.min_size, args.max_size = 2, 64, 96
        args.train_warmup, args.train_rounds = 0, 1
        if args.backend is None:
            args.backend = 'aot_eager'
    if args.backend is None:
        args.backend = 'inductor'
    return args


def main(argv: Optional[List[str]] = None) -> dict:
    args = parse_args(argv)
    device = benchmark_device(args.device, args.threads)
    env = benchmark_env(device, backend=args.backend,
                        cold_cache=args.cold_cache)
    print(f'{env_line(env)}; backend {args.backend}, dynamic=True; batch '
          f'{args.batch}, {args.dims} dims, {args.heads} heads; median of '
          f'{args.rounds} round-robin rounds', flush=True)
    results = dict(env=env, args=dict(vars(args), grid='x'.join(
        str(g) for g in args.grid)))
    caches = (torch._inductor.config.patch(force_disable_caches=True)
              if args.cold_cache else contextlib.nullcontext())
    with caches:
        _prewarm(args.backend)
        for part in args.parts:
            if part == 'train_step':
                results[part] = train_step_part(args, device)
            else:
                results[part] = attention_part(part, args, device)
            finish_env(env)
            if args.out:  # after every part: a long run
                write_json(args.out, results)
    print(f'\nload average at the end {env["load_avg_end"]}')
    return results


if __name__ == '__main__':
    main()
