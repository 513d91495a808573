"""Speed and peak memory of iRPE attention against mmcv's MultiheadAttention.

Measures one encoder self-attention layer and a whole 6-layer DETR encoder
(mmdet's ``DetrTransformerEncoder`` against mmpe's iRPE encoder of
``mmpe/models/detectors/detr_irpe.py``) at DETR feature grids (25 x 42 = an
800 x 1333 image at stride 32 by default; 13 x 21 and 50 x 84 with
``--grids``), batch 2, 256 dims, 8 heads. The second image of the batch is
padded at the bottom / right like mmdet pads a batch (``--pad``), so key
padding masks are exercised.

Rows (layer level):

* ``mmcv MHA`` - mmcv's ``MultiheadAttention`` (wrapping
  ``nn.MultiheadAttention``), the baseline every ratio refers to;
* ``mmpe no RPE`` - :class:`iRPEMultiheadAttention` with ``rpe_cfg=None``;
* ``mmpe {bias,ctx} {product,cross,euclidean,quant} {k,qk,qkv}`` (bias: k,
  qk only) with ``attn_impl='explicit'``, tables Xavier-initialised;
* ``Eq.27-28 ctx product k`` - the paper's Eq. 27-28 as written, a reference
  of what mmpe improves on: the (B, H, L, num_buckets) lookup ``q @ R^T`` is
  flattened and indexed with ``i * num_buckets + bucket(i, j)`` (an (L, L)
  long index), added to the logits, then ``masked_fill``, softmax, ``@ v``;
* ``mmpe ... (sdpa)`` - ``attn_impl='sdpa'``: the iRPE terms on queries /
  keys materialised (with their gradient) as the float mask of
  ``F.scaled_dot_product_attention`` (no iRPE on values there);
* ``mmpe ctx product k (plain softmax)`` and ``(plain softmax, add_)`` - the
  explicit ``mmpe ctx product k`` row with, for that row's calls only,
  ``mmpe.models.layers.attention.ops.masked_softmax`` (the in-place softmax
  built on the private ``aten._softmax.out`` /
  ``_softmax_backward_data.out``) replaced by ``torch.softmax(logits +
  mask, -1)``, resp. by ``logits.add_(mask)`` then ``torch.softmax(logits,
  -1)`` (see :func:`plain_softmax`). The A/B of issue 11 item 5; fwd+bwd
  only, since without gradient the explicit backend runs SDPA and never
  calls the softmax;
* ``mmpe ... (flex)`` - ``attn_impl='flex'`` (FlexAttention, opt-in, never
  chosen automatically; compiled once per shape before timing). On CPU
  only the forward exists in PyTorch 2.13, so its fwd+bwd columns are empty
  there.
* ``mmpe {log-cpb,alibi-2d,lookhere} ({explicit,fused})`` - the offset
  biases (Swin-V2's log-CPB, 2D ALiBi, LookHere: a per-head table of the
  grid's ``(2h-1)(2w-1)`` offsets, product layout), beside ``mmpe bias
  product k clip-grid (...)``, iRPE's product bias whose clip distance
  covers the grid: the same backends on the same layout.

Encoder rows: the same backends on a 6-layer encoder (``... encoder``).

What is measured, per row:

* ``fwd+bwd ms``: wall time of ``out = layer(x, ...)`` then
  ``out.backward(g)`` with ``x`` requiring grad (training); ``fwd ms``: wall
  time of the forward under ``torch.no_grad()`` (inference; here mmpe's
  explicit backend hands the constant iRPE terms to
  ``scaled_dot_product_attention``, as ``'sdpa'`` does).
  Rows are run round-robin (one repetition of every row, then the next
  round), after one warm-up round; the median over ``--rounds`` rounds is
  reported, and every ratio divides by the baseline's median from the same
  run. On CUDA the clock is read after ``torch.cuda.synchronize()``.
* ``peak MB``: the largest amount of memory held by tensors allocated during
  one run, above what was allocated when the run started (inputs, weights
  and cached bucket tables are not counted; parameter gradients are; how:
  ``bench_measure.py``). Measured in separate, untimed runs.

The rows are built in ``attention_rows.py``, reported by
``attention_report.py``; ``--long`` runs ``attention_long.py``.

Run on a quiet machine (``uptime``: load below the number of cores)::

    python tools/benchmark/attention.py --out work_dirs/bench_attention.json
    python tools/benchmark/attention.py --grids 13x21 25x42 50x84 \\
        --variants 'mmcv|ctx product k|bias product k|Eq' --no-encoder
    python tools/benchmark/attention.py --quick --out /tmp/quick.json
"""
import argparse
import json
import re
import warnings
from typing import List, Optional

from attention_long import (HEAD_CFGS, LONG_GRIDS, LONG_MODES, long_main,
                            memory_row)
from attention_report import (SOFTMAX_KEEP, check_targets, print_table,
                              softmax_ab)
from attention_rows import BASELINE, encoder_rows, layer_rows
from bench_measure import (Inputs, add_layer_args, add_report_args, measure,
                           parse_grid, profile_rows, summarise)

from mmpe.models.layers.attention.flex import flex_unsupported_reason
from mmpe.utils.bench_env import (add_device_args, benchmark_device,
                                  benchmark_env, env_line, finish_env)
from mmpe.utils.benchmark_helpers import write_json


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--grids', nargs='+', type=parse_grid, default=[(25, 42)],
        help='feature grids HxW (DETR: 13x21, 25x42, 50x84)')
    add_layer_args(parser)
    add_device_args(parser)
    parser.add_argument(
        '--variants', default=None,
        help='regex: only rows whose name matches (the baseline is always '
        'kept)')
    parser.add_argument('--no-encoder', action='store_true',
                        help='skip the 6-layer encoder rows')
    parser.add_argument('--no-memory', action='store_true',
                        help='skip the peak-memory runs')
    parser.add_argument('--no-flex', action='store_true',
                        help='skip the FlexAttention rows')
    parser.add_argument(
        '--quick', action='store_true',
        help='small and fast (tests): 6x8 grid, batch 2, 64 dims, 4 heads, '
        '2 rounds, 2-layer encoder, a few rows, no flex')
    add_report_args(parser)
    group = parser.add_argument_group(
        'long sequences (--long): one layer, fused no-RPE path against iRPE')
    group.add_argument('--long', action='store_true',
                       help='run the long-sequence benchmark instead')
    group.add_argument('--lengths', nargs='+', type=int,
                       default=[1050, 4096, 8192],
                       choices=sorted(LONG_GRIDS),
                       help='token counts (grids: 25x42, 64x64, 64x128)')
    group.add_argument('--long-grids', nargs='+', type=parse_grid,
                       default=None,
                       help='grids HxW instead of --lengths')
    group.add_argument('--head-cfgs', nargs='+', default=list(HEAD_CFGS),
                       choices=list(HEAD_CFGS),
                       help='vit-s: 384 dims, 6 heads (timm layout); '
                       'detr: 256 dims, 8 heads (mmcv layout)')
    group.add_argument('--long-batch', type=int, default=None,
                       help='batch of every length (default: 2 up to 2048 '
                       'tokens, 1 above)')
    group.add_argument('--modes', nargs='+', default=list(LONG_MODES),
                       choices=list(LONG_MODES))
    group.add_argument('--backend', default='inductor',
                       help='torch.compile backend of the compiled rows')
    group.add_argument('--explicit-max-length', type=int, default=4096,
                       help='longest L with the explicit row (its (B, H, L, '
                       'L) buffers: 1.6 GB each at 8192, ViT-S, batch 1)')
    group.add_argument('--amp', action='store_true',
                       help='run every row under bf16 autocast (as '
                       'tools/train.py --amp does on CPU)')
    group.add_argument('--long-memory-row', default=None,
                       help=argparse.SUPPRESS)  # internal: one memory row
    args = parser.parse_args(argv)
    if args.quick:
        args.grids, args.dims, args.heads = [(6, 8)], 64, 4
        args.rounds, args.encoder_layers, args.no_flex = 2, 2, True
        if args.variants is None:
            args.variants = ('no RPE|ctx product k|bias product k$|'
                             r'bias product k \(sdpa\)|Eq|encoder')
    return args


def main(argv: Optional[List[str]] = None) -> dict:
    args = parse_args(argv)
    if args.long_memory_row:
        print('MEMORY ' + json.dumps(memory_row(json.loads(
            args.long_memory_row))), flush=True)
        return {}
    if args.long:
        return long_main(args)
    device = benchmark_device(args.device, args.threads)
    flex_ok = {
        'fwd_bwd':
        not args.no_flex and flex_unsupported_reason(device, True) is None,
        'fwd':
        not args.no_flex and flex_unsupported_reason(device, False) is None
    }
    env = benchmark_env(device, flex=flex_ok)
    print(f'{env_line(env)}; batch {args.batch}, {args.dims} dims, '
          f'{args.heads} heads; median of {args.rounds} interleaved rounds; '
          f'x = ratio to {BASELINE!r} of the same run')
    results = dict(env=env, args={
        k: (v if k != 'grids' else [f'{h}x{w}' for h, w in v])
        for k, v in vars(args).items()
    }, grids={})
    pattern = re.compile(args.variants) if args.variants else None
    for grid in args.grids:
        key = f'{grid[0]}x{grid[1]}'
        inputs = Inputs(args.batch, grid, args.dims, args.pad, device)
        res = {}
        groups = [('layer', layer_rows)]
        if not args.no_encoder:
            groups.append(('encoder', encoder_rows))
        for group, build in groups:
            rows = build(args, device, flex_ok)
            base = rows[0].name
            if pattern is not None:
                rows = [
                    r for r in rows if r.name == base or pattern.search(r.name)
                ]
            if args.no_flex:
                rows = [r for r in rows if '(flex)' not in r.name]
            if args.verbose:
                print(f'{key} {group}: {len(rows)} rows', flush=True)
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')
                measure(rows, inputs, args, device)
            recs = summarise(rows, base)
            res[group] = recs
            print_table(
                f'{group} @ {key} (L = {grid[0] * grid[1]}, '
                f'{args.encoder_layers if group == "encoder" else 1} '
                'layer(s))', recs)
            if args.profile:
                res[f'{group}_profile'] = profile_rows(
                    rows, inputs, args.profile, device)
            del rows
        res['targets'] = check_targets(res['layer'])
        res['softmax_ab'] = softmax_ab(res['layer'])
        results['grids'][key] = res
        if res['targets']:
            print('\ntargets (layer, fwd+bwd):')
            for name, t in res['targets'].items():
                print(f'  {name}: {t["value"]:.2f} (limit {t["limit"]}) '
                      f'{"met" if t["met"] else "NOT met"}')
        if res['softmax_ab']:
            print('\nsoftmax A/B (layer, fwd+bwd, plain / in-place private '
                  f'ATen; keep the private calls if >= {SOFTMAX_KEEP}):')
            for name, t in res['softmax_ab'].items():
                if name != 'keep_private_aten':
                    print(f'  {name}: {t["plain_ms"]:.1f} / '
                          f'{t["in_place_ms"]:.1f} ms = {t["ratio"]:.2f}')
            print(f'  keep private ATen calls: '
                  f'{res["softmax_ab"]["keep_private_aten"]}')
    finish_env(env)
    if args.out:
        write_json(args.out, results)
    return results


if __name__ == '__main__':
    main()
