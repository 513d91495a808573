"""How the proxy ablation (``ablation.py``) runs a tool: ``python cmd``
from the repository root in a subprocess, its output into a log file, with
its wall time and the peak resident memory of that one process (the
kernel's accounting of the child, ``os.wait4``). Imports nothing of torch or
mmpe, so that the launcher's own size (a floor of the measured peak) stays
small."""
import os
import os.path as osp
import subprocess
import sys
import time
from typing import Optional, Sequence, Tuple

#: the runs' working directory (the configs' relative paths start there)
ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))


def run_script(cmd: Sequence[str], log_file: str,
               threads: Optional[int] = None) -> float:
    """Seconds of ``python cmd`` (see :func:`run_script_measured`)."""
    return run_script_measured(cmd, log_file, threads)[0]


def run_script_measured(cmd: Sequence[str], log_file: str,
                        threads: Optional[int] = None
                        ) -> Tuple[float, float]:
    """Run ``python cmd`` from the repository root, output to ``log_file``.

    Returns:
        tuple[float, float]: Wall seconds and the peak resident memory in
        MB of that process (the largest of it and the children it waited
        for, e.g. data workers), from the kernel's accounting of this one
        child (``os.wait4``), so runs side by side are told apart. Linux
        keeps the high-water mark of the launching process image from
        before ``exec``, so this script's own size (tens of MB: it imports
        no torch) is a floor of the number.
    """
    env = dict(os.environ)
    if threads:  # parallel runs must not oversubscribe the cores
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    start = time.time()
    with open(log_file, 'w') as log:
        proc = subprocess.Popen(
            [sys.executable, *cmd],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f'{" ".join(cmd)} failed; see {log_file}')
    return seconds, usage.ru_maxrss / 1024  # Linux: ru_maxrss in KiB
