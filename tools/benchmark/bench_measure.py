"""How the attention benchmarks (``attention.py``, ``attention_long.py``,
``compiled.py``) measure a row: wall time of one forward or forward +
backward, the peak of the memory held by tensors allocated during one run,
the rise of the resident set, round-robin rounds with medians, and the
ops where the time goes (``torch.profiler``).

* time: the clock is read after ``torch.cuda.synchronize()`` on CUDA;
* tensor peak: on CPU the maximum of the running sum of the allocation /
  free events that ``torch.profiler.profile(profile_memory=True)`` records
  (every tensor allocation through PyTorch's CPU allocator, in time order);
  on CUDA ``torch.cuda.max_memory_allocated()`` after
  ``torch.cuda.reset_peak_memory_stats()``; both minus what was allocated
  when the run started (inputs, weights and cached tables are not counted,
  parameter gradients are);
* resident peak (Linux): how far the RSS high-water mark rose, every page
  the run touches, tensors or not (allocator caches, MKL buffers).
"""
import argparse
import ctypes
import gc
import re
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from mmpe.utils.benchmark_helpers import (cpu_peak_bytes, cuda_peak_bytes,
                                         resident_mb)

PASSES = ('fwd_bwd', 'fwd')


class Row:
    """One benchmarked module and how to call it.

    Args:
        name (str): Row label.
        module (nn.Module): The layer or encoder.
        call (callable): ``call(module, x, inputs) -> Tensor``.
        backward (bool): Whether fwd+bwd is timed.
        forward (bool): Whether the no-grad forward is timed.
    """

    def __init__(self, name: str, module: nn.Module,
                 call: Callable[..., Tensor], backward: bool,
                 forward: bool) -> None:
        self.name, self.module, self.call = name, module, call
        self.backward, self.forward = backward, forward
        self.times: Dict[str, List[float]] = {'fwd_bwd': [], 'fwd': []}
        self.peak: Dict[str, Optional[float]] = {'fwd_bwd': None, 'fwd': None}

    def runs(self, what: str) -> bool:
        """Whether the pass ``what`` ('fwd_bwd' or 'fwd') is measured."""
        return self.backward if what == 'fwd_bwd' else self.forward


def padding_mask(batch: int, grid: Tuple[int, int], pad: float) -> Tensor:
    """(batch, h, w) bool, True = padding: with ``batch > 1`` the last image
    is the smaller one, padded by ``pad`` of its rows at the bottom and of
    its columns at the right (as mmdet pads a batch)."""
    h, w = grid
    mask = torch.zeros(batch, h, w, dtype=torch.bool)
    if batch > 1 and pad > 0:
        mask[-1, h - int(pad * h):] = True
        mask[-1, :, w - int(pad * w):] = True
    return mask


class Inputs:
    """A padded DETR batch: tokens, positions, key padding mask, grid."""

    def __init__(self, batch: int, grid: Tuple[int, int], dims: int,
                 pad: float, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(0)
        n = grid[0] * grid[1]
        self.grid = grid
        self.x = torch.randn(batch, n, dims, generator=gen).to(device)
        self.pos = torch.randn(batch, n, dims, generator=gen).to(device)
        self.grad = torch.randn(batch, n, dims, generator=gen).to(device)
        self.mask = padding_mask(batch, grid, pad).flatten(1).to(device)


def sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def run_pass(row: Row, s: Inputs, what: str) -> None:
    """One no-grad forward (``'fwd'``) or forward + backward of ``row``."""
    if what == 'fwd':
        with torch.no_grad():
            row.call(row.module, s.x, s)
        return
    x = s.x.detach().requires_grad_()
    row.call(row.module, x, s).backward(s.grad)


def clear_grads(row: Row) -> None:
    for p in row.module.parameters():
        p.grad = None


def time_once(row: Row, s: Inputs, what: str, device: torch.device) -> float:
    """Seconds of one forward (no grad) or forward + backward."""
    clear_grads(row)
    sync(device)
    t0 = time.perf_counter()
    run_pass(row, s, what)
    sync(device)
    return time.perf_counter() - t0


def peak_memory(row: Row, s: Inputs, what: str,
                device: torch.device) -> Optional[float]:
    """Peak bytes held by tensors allocated during one run (see the module
    docstring), or None if the profiler cannot tell."""
    clear_grads(row)
    if device.type == 'cuda':
        return cuda_peak_bytes(lambda: run_pass(row, s, what), device)
    return cpu_peak_bytes(lambda: run_pass(row, s, what))


def rss_peak(run: Callable[[], None]) -> Optional[float]:
    """Bytes by which the resident set's high-water mark rose during
    ``run()`` (Linux): free heap pages are returned first (``malloc_trim``)
    and the mark is reset (``/proc/self/clear_refs``), so every page the
    run touches counts; None where the OS offers neither."""
    try:
        gc.collect()
        ctypes.CDLL('libc.so.6').malloc_trim(0)
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')  # VmHWM := VmRSS
        base = resident_mb('VmRSS')
    except OSError:
        return None
    run()
    return (resident_mb('VmHWM') - base) * 2**20


def measure(rows: List[Row], s: Inputs, args: argparse.Namespace,
            device: torch.device) -> None:
    """Warm up, then interleaved timed rounds, then peak memory
    (``args``: ``passes``, ``rounds``, ``verbose``, ``no_memory``)."""
    whats = [w for w in PASSES if w in args.passes]
    for row in rows:  # warm-up: bucket caches, flex compilation
        for what in whats:
            if row.runs(what):
                time_once(row, s, what, device)
    for r in range(args.rounds):
        for what in whats:
            for row in rows:
                if row.runs(what):
                    row.times[what].append(time_once(row, s, what, device))
        if args.verbose:
            print(f'  round {r + 1}/{args.rounds} done', flush=True)
    if args.no_memory:
        return
    for what in whats:
        for row in rows:
            if row.runs(what):
                row.peak[what] = peak_memory(row, s, what, device)


def profile_rows(rows: List[Row], s: Inputs, pattern: str,
                 device: torch.device, top: int = 12) -> Dict[str, list]:
    """Where the fwd+bwd time goes: the ``top`` ops by self time (3 runs
    under ``torch.profiler``) of the rows matching ``pattern``."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU]
    if device.type == 'cuda':
        acts.append(ProfilerActivity.CUDA)
    out = {}
    for row in rows:
        if not row.backward or not re.search(pattern, row.name):
            continue
        with profile(activities=acts, record_shapes=True) as prof:
            for _ in range(3):
                time_once(row, s, 'fwd_bwd', device)
        stats = prof.key_averages(group_by_input_shape=True)
        key = ('self_device_time_total'
               if device.type == 'cuda' else 'self_cpu_time_total')
        total = sum(getattr(e, key) for e in stats) or 1.0
        ops = sorted(stats, key=lambda e: -getattr(e, key))[:top]
        out[row.name] = [
            dict(op=e.key, shapes=str(e.input_shapes)[:120],
                 calls=e.count // 3, ms=getattr(e, key) / 3e3,
                 share=getattr(e, key) / total) for e in ops
        ]
        print(f'\nprofile of {row.name!r} (fwd+bwd, per run):')
        for o in out[row.name]:
            print(f'  {o["ms"]:8.1f} ms {100 * o["share"]:5.1f}%  '
                  f'{o["op"]:<32} x{o["calls"]:<3} {o["shapes"]}')
    return out


def summarise(rows: List[Row], base_name: str) -> List[dict]:
    """Medians and ratios to the row ``base_name``."""
    base = next(r for r in rows if r.name == base_name)
    out = []
    for row in rows:
        rec = dict(name=row.name)
        for what in PASSES:
            ts = row.times[what]
            med = statistics.median(ts) if ts else None
            bmed = (statistics.median(base.times[what])
                    if base.times[what] else None)
            rec[f'{what}_ms'] = None if med is None else med * 1e3
            rec[f'{what}_ms_all'] = [t * 1e3 for t in ts]
            rec[f'{what}_time_ratio'] = (None if med is None or not bmed else
                                         med / bmed)
            peak, bpeak = row.peak[what], base.peak[what]
            rec[f'{what}_peak_mb'] = None if peak is None else peak / 2**20
            rec[f'{what}_mem_ratio'] = (None if peak is None or not bpeak else
                                        peak / bpeak)
        out.append(rec)
    return out


def add_layer_args(parser: argparse.ArgumentParser) -> None:
    """The batch and layers measured and the passes timed: ``--batch``,
    ``--dims``, ``--heads``, ``--pad``, ``--dropout``,
    ``--encoder-layers``, ``--rounds``, ``--passes``."""
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--dims', type=int, default=256)
    parser.add_argument('--heads', type=int, default=8)
    parser.add_argument(
        '--pad', type=float, default=0.1,
        help='fraction of rows and of columns padded in the last image')
    parser.add_argument('--dropout', type=float, default=0.0,
                        help='attention / FFN dropout (training passes)')
    parser.add_argument('--encoder-layers', type=int, default=6)
    parser.add_argument('--rounds', type=int, default=7,
                        help='interleaved timed rounds (median reported)')
    parser.add_argument('--passes', nargs='+', default=list(PASSES),
                        choices=PASSES)


def add_report_args(parser: argparse.ArgumentParser) -> None:
    """``--profile REGEX``, ``--out`` (JSON) and ``--verbose``."""
    parser.add_argument(
        '--profile', default=None, metavar='REGEX',
        help='also profile (torch.profiler) the fwd+bwd of matching rows')
    parser.add_argument('--out', help='write the results as JSON here')
    parser.add_argument('--verbose', action='store_true')


def fmt(v: Optional[float], spec: str) -> str:
    """A table cell: ``v`` formatted, '-' for a value not measured."""
    return '-' if v is None else format(v, spec)


def parse_grid(text: str) -> Tuple[int, int]:
    """``'25x42'`` -> ``(25, 42)`` (height x width); an ``argparse`` type."""
    m = re.fullmatch(r'(\d+)x(\d+)', text)
    if not m or 0 in (int(m.group(1)), int(m.group(2))):
        raise argparse.ArgumentTypeError(
            f'grid {text!r} must look like 25x42 (height x width, positive)')
    return int(m.group(1)), int(m.group(2))
