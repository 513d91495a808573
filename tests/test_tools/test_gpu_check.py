"""tools/gpu_check.py (make gpu-check) on a machine without CUDA: one line
that says so, exit status 0, no report."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason='with CUDA the check runs in full (make gpu-check)')
def test_without_cuda_one_line_and_exit_0(tmp_path):
    out_dir = tmp_path / 'gpu_check'
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'tools', 'gpu_check.py'),
         '--out-dir', str(out_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith('gpu-check: no CUDA device'), lines
    assert 'nothing checked' in lines[0]
    assert not out_dir.exists()
