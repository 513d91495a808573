"""Time forward + backward of the iRPE term alone against ``q @ k^T``.

Isolates the cost iRPE adds to one attention layer: the (B, H, L, L) term of
contextual / bias iRPE on keys (or the (B, H, L, head_dim) output on values)
and its backward, next to the ``q @ k^T`` logits it is added to, at a DETR
grid (25 x 42 = an 800 x 1333 image at stride 32), batch 2, 8 heads,
head_dim 32 by default. Variants of the contextual product term:

* ``mmpe``: :class:`mmpe.models.layers.iRPE` (for product: gathers with
  per-axis indices forward, one-hot matmuls backward; see its docstring).
* ``q@k^T + ...``: the logits plus the term, as attention uses it, and
  ``q@k^T += ... (logits=)``: the term added in place by
  ``iRPE.forward(..., logits=)``.
* ``gather``: ``x @ table^T`` then ``torch.gather`` with the (L, L) bucket ids
  (autograd's backward is a scatter-add).
* ``eq27``: the paper's Eq. 27-28 as written (and the authors' release
  without its C++ op): flatten the (B, H, L, num_buckets) table and index it
  with ``i * num_buckets + bucket(i, j)``.

Repetitions are interleaved across variants and the median is reported, with
the ratio to ``q @ k^T`` fwd + bwd measured in the same run. Run on a quiet
machine (check ``uptime``; on a busy one, ``OMP_NUM_THREADS=1`` with
``--clock cpu`` is steadier), e.g.::

    python tools/benchmark/irpe_term.py --height 25 --width 42
    python tools/benchmark/irpe_term.py --methods product cross euclidean \
        --modes contextual bias --on k v --json out.json
"""
import argparse
import json
import statistics
import time
from typing import Callable, Dict, List

import torch

from mmpe.models.layers.irpe.irpe import iRPE
from mmpe.utils.bench_env import benchmark_env, finish_env


def term_gather(x: torch.Tensor, table: torch.Tensor,
                ids: torch.Tensor) -> torch.Tensor:
    """Contextual iRPE on keys with a plain gather.

    Args:
        x (Tensor): Queries (B, H, L, head_dim).
        table (Tensor): Shared table (num_buckets, head_dim).
        ids (Tensor): Bucket ids (L, L), long.

    Returns:
        Tensor: (B, H, L, L).
    """
    values = x @ table.t()  # (B, H, L, num_buckets)
    return values.gather(-1, ids.expand(*x.shape[:2], -1, -1))


def term_eq27(x: torch.Tensor, table: torch.Tensor,
              ids: torch.Tensor) -> torch.Tensor:
    """Contextual iRPE on keys as Eq. 27-28: index the flattened table.

    Args:
        x (Tensor): Queries (B, H, L, head_dim).
        table (Tensor): Shared table (num_buckets, head_dim).
        ids (Tensor): Bucket ids (L, L), long.

    Returns:
        Tensor: (B, H, L, L).
    """
    b, h, length, _ = x.shape
    nb = table.shape[0]
    values = x @ table.t()  # (B, H, L, num_buckets)
    offset = torch.arange(length, device=x.device)[:, None] * nb
    flat = (ids + offset).flatten()  # i * num_buckets + bucket(i, j)
    return values.flatten(2)[:, :, flat].view(b, h, length, length)


def _fwd_bwd(fn: Callable[[], torch.Tensor], grad: torch.Tensor,
             clock: Callable[[], float]) -> float:
    t0 = clock()
    fn().backward(grad)
    return clock() - t0


def run(args: argparse.Namespace) -> List[Dict]:
    """Time every requested case; returns one dict per case."""
    torch.manual_seed(0)
    b, heads, dim = args.batch, args.heads, args.head_dim
    h, w = args.height, args.width
    length = h * w
    q = torch.randn(b, heads, length, dim, requires_grad=True)
    k = torch.randn(b, heads, length, dim, requires_grad=True)
    attn = torch.randn(b, heads, length, length).softmax(-1).requires_grad_()
    g_logits = torch.randn(b, heads, length, length)
    g_out = torch.randn(b, heads, length, dim)

    cases: Dict[str, tuple] = {
        'q@k^T': (lambda: q @ k.transpose(-1, -2), g_logits)
    }
    for mode in args.modes:
        for method in args.methods:
            for on in args.on:
                if mode == 'bias' and on == 'v':
                    continue
                rpe = iRPE(dim,
                           heads,
                           mode=mode,
                           method=method,
                           on=on,
                           ratio=args.ratio,
                           init='xavier')
                name = f'mmpe {mode} {method} on {on}'
                if on == 'v':
                    cases[name] = (lambda r=rpe: r(attn, h, w), g_out)
                else:  # bias: (1, H, L, L), summed over the batch in bwd
                    cases[name] = (
                        lambda r=rpe: r(q, h, w).expand_as(g_logits), g_logits)
                    # as attention uses it: added to the logits, or in place
                    cases[f'q@k^T + {name[5:]}'] = (
                        lambda r=rpe: q @ k.transpose(-1, -2) + r(q, h, w),
                        g_logits)
                    cases[f'q@k^T += {name[5:]} (logits=)'] = (lambda r=rpe: r(
                        q, h, w, logits=q @ k.transpose(-1, -2)), g_logits)
                if mode == 'contextual' and on == 'k' and method != 'cross':
                    table = rpe.table[0]
                    ids = rpe.bucket_ids(h, w)
                    for ref_name, ref in (('gather', term_gather),
                                          ('eq27', term_eq27)):
                        cases[f'{ref_name} {mode} {method} on {on}'] = (
                            lambda f=ref, t=table, i=ids: f(q, t, i), g_logits)

    clock = time.perf_counter if args.clock == 'wall' else time.process_time
    times: Dict[str, List[float]] = {name: [] for name in cases}
    for name, (fn, grad) in cases.items():  # warm-up (and bucket caches)
        _fwd_bwd(fn, grad, clock)
    for _ in range(args.reps):  # interleaved repetitions
        for name, (fn, grad) in cases.items():
            times[name].append(_fwd_bwd(fn, grad, clock))
    base = statistics.median(times['q@k^T'])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append(dict(case=name, median_ms=med * 1e3, ratio=med / base))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--height', type=int, default=25)
    parser.add_argument('--width', type=int, default=42)
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--heads', type=int, default=8)
    parser.add_argument('--head-dim', type=int, default=32)
    parser.add_argument('--ratio', type=float, default=1.9)
    parser.add_argument('--methods',
                        nargs='+',
                        default=['product'],
                        choices=iRPE.METHODS)
    parser.add_argument('--modes',
                        nargs='+',
                        default=['contextual'],
                        choices=iRPE.MODES)
    parser.add_argument('--on', nargs='+', default=['k'], choices=iRPE.ONS)
    parser.add_argument('--reps', type=int, default=10)
    parser.add_argument(
        '--clock',
        default='wall',
        choices=['wall', 'cpu'],
        help="'cpu': process CPU time (user + system, all threads), steadier "
        'than wall time on a shared machine (use with OMP_NUM_THREADS=1)')
    parser.add_argument('--json', help='also write the rows to this file')
    args = parser.parse_args()
    env = benchmark_env(torch.device('cpu'))
    rows = run(args)
    print(f'grid {args.height}x{args.width}, B={args.batch}, '
          f'H={args.heads}, head_dim={args.head_dim}, '
          f'threads={env["threads"]}, fwd+bwd median of '
          f'{args.reps}, {args.clock} clock')
    print(f'{"case":<50}{"ms":>9}{"x q@k^T":>10}')
    for row in rows:
        print(f'{row["case"]:<50}{row["median_ms"]:>9.2f}'
              f'{row["ratio"]:>10.2f}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(env=finish_env(env), args=vars(args), rows=rows),
                      f, indent=2)


if __name__ == '__main__':
    main()
