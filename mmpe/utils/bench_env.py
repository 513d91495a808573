"""Where a benchmark ran, written into its JSON beside the numbers: the
date, torch's version, the device and its name, the cores and intra-op
threads, the load average at the start (and, by :func:`finish_env`, at the
end) and the environment variables that change CPU timings. One record for
every script of ``tools/benchmark``, so that their reports compare."""
import argparse
import os
import platform
from datetime import datetime, timezone
from typing import Optional, Tuple

import torch

from .arg_checks import check_int

#: allocator and threading knobs that change CPU timings (page faults of
#: fresh large buffers, OpenMP threads)
TIMING_ENV_VARS = ('OMP_NUM_THREADS', 'THP_MEM_ALLOC_ENABLE', 'LD_PRELOAD')

DEVICES = ('cpu', 'cuda', 'auto')


def load_average() -> Optional[Tuple[float, float, float]]:
    """The 1, 5 and 15 minute load averages, None where the OS has none."""
    return os.getloadavg() if hasattr(os, 'getloadavg') else None


def add_device_args(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--threads``, for :func:`benchmark_device`."""
    parser.add_argument('--device', default='cpu',
                        help="'cpu', 'cuda' or 'auto' (cuda if present)")
    parser.add_argument('--threads', type=int, default=None,
                        help='torch.set_num_threads (default: unchanged)')


def benchmark_device(device: str = 'cpu',
                     threads: Optional[int] = None) -> torch.device:
    """Set the intra-op ``threads`` (if given) and resolve ``device``
    (``'auto'``: CUDA when available, else the CPU)."""
    kind = str(device).split(':')[0]
    if kind not in DEVICES:
        raise ValueError(f'device {device!r}: choose from {DEVICES} (cuda '
                         'may name an index, cuda:1)')
    if threads is not None:
        check_int('threads', threads)
        torch.set_num_threads(threads)
    if device == 'auto':
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    return torch.device(device)


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's as the platform reports it."""
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def benchmark_env(device: torch.device, **extra) -> dict:
    """The record of this process: ``date`` (UTC), ``torch``, ``device``,
    ``device_name``, ``cpu_count``, ``threads``, ``load_avg_start``,
    ``env_vars`` (:data:`TIMING_ENV_VARS`), then ``extra`` (a script's own
    settings, e.g. the compile backend)."""
    return dict(
        date=datetime.now(timezone.utc).isoformat(timespec='seconds'),
        torch=torch.__version__,
        device=str(device),
        device_name=device_name(device),
        cpu_count=os.cpu_count(),
        threads=torch.get_num_threads(),
        load_avg_start=load_average(),
        env_vars={k: os.environ.get(k)
                  for k in TIMING_ENV_VARS},
        **extra)


def finish_env(env: dict) -> dict:
    """Add the load average now (``load_avg_end``) to ``env``; returns it."""
    env['load_avg_end'] = load_average()
    return env


def env_line(env: dict) -> str:
    """The record in one line, for the head of a report."""
    return (f'torch {env["torch"]} on {env["device"]} '
            f'({env["device_name"]}), {env["threads"]} threads, load '
            f'average {env["load_avg_start"]}')
