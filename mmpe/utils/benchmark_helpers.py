"""Helpers of the benchmark scripts (``tools/benchmark``,
``tools/gpu_check.py``) and the memory tests: a process's own resident
memory, the CPU and CUDA tensor peaks of one call, and image sizes written
``WIDTHxHEIGHT``."""
import argparse
from typing import Callable, Optional, Tuple

import torch


def resident_mb(field: str = 'VmHWM') -> float:
    """This process's ``VmRSS`` (resident now) or ``VmHWM`` (high-water
    mark) in MB, from ``/proc/self/status`` (Linux).

    Both count this process image only: ``exec`` starts them afresh, so a
    child's numbers do not include its launcher (unlike ``ru_maxrss``).
    """
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024  # kB
    raise ValueError(f'no {field!r} in /proc/self/status; choose VmRSS or '
                     'VmHWM')


def cuda_peak_bytes(run: Callable[[], object], device: torch.device) -> float:
    """Bytes allocated on the CUDA ``device`` at the peak of ``run()``,
    above what was allocated when it started
    (``torch.cuda.max_memory_allocated`` after resetting the peak)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    run()
    torch.cuda.synchronize(device)
    return float(torch.cuda.max_memory_allocated(device) - base)


def cpu_peak_bytes(run: Callable[[], object]) -> Optional[float]:
    """Bytes held by CPU tensors allocated during ``run()`` at its peak:
    the maximum of the running sum of the allocation / free events that
    ``torch.profiler.profile(profile_memory=True)`` records (every
    allocation through PyTorch's CPU allocator, in time order; what was
    allocated before ``run()`` is not counted). Deterministic for a
    deterministic ``run``; None where the profiler cannot tell."""
    try:
        from torch._C._profiler import _EventType
        from torch.profiler import ProfilerActivity, profile
    except ImportError:  # pragma: no cover
        return None
    with profile(activities=[ProfilerActivity.CPU],
                 profile_memory=True) as prof:
        run()
    sizes = []

    def walk(events):
        for e in events:
            if e.typed[0] == _EventType.Allocation:
                sizes.append((e.start_time_ns, e.typed[1].alloc_size))
            walk(e.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    live = peak = 0
    for _, size in sorted(sizes, key=lambda t: t[0]):
        live += size
        peak = max(peak, live)
    return float(peak)


def parse_image_size(text: str) -> Tuple[int, int]:
    """``'1333x800'`` (width x height, as image sizes are written) ->
    ``(800, 1333)`` (height, width); an ``argparse`` type."""
    try:
        width, height = (int(v) for v in text.lower().split('x'))
        if width <= 0 or height <= 0:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'image size {text!r}: write WIDTHxHEIGHT with positive ints, '
            'e.g. 1333x800')
    return height, width


def write_json(path: str, result: dict) -> None:
    """Write a benchmark's ``result`` to ``path`` (its folder made) and say
    so."""
    import json
    import os
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        json.dump(result, f, indent=1)
    print(f'wrote {path}')
