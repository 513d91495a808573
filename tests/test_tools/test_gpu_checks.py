"""tools/gpu_checks.py, the parts of ``make gpu-check`` that run without a
GPU: the report's copy under docs/data (named after the device, naming the
versions), and the fused kernel's check against the explicit backend run
here by Triton's interpreter on CPU (as the kernel's own tests run)."""
import importlib.util
import json
import os

import pytest
import torch

from mmpe.models.layers.attention.backends import ATTENTION_BACKENDS, choice
from mmpe.models.layers.attention.fused_triton import interpreted

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
_spec = importlib.util.spec_from_file_location(
    'mmpe_tool_gpu_checks', os.path.join(ROOT, 'tools', 'gpu_checks.py'))
gpu_checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_checks)

ENV = dict(device='cuda', device_name='NVIDIA H100 80GB HBM3',
           torch='2.11.0+cu130', triton='3.9.0', cuda='13.0')


def test_write_data_names_the_files_after_the_device(tmp_path):
    record = dict(env=ENV, passed=False, results={'tests': True,
                                                  'fused': False},
                  steps={'fused': dict(ok=False, data=dict(rows=[]))})
    text = '# mmpe gpu-check\n\ntorch 2.11.0+cu130 on cuda (NVIDIA H100 ' \
           '80GB HBM3); triton 3.9.0; CUDA 13.0'
    paths = gpu_checks.write_data(text, record, str(tmp_path / 'data'))
    stem = tmp_path / 'data' / 'gpu_check_nvidia-h100-80gb-hbm3'
    assert paths == [str(stem) + '.md', str(stem) + '.json']
    assert (tmp_path / 'data' / 'gpu_check_nvidia-h100-80gb-hbm3.md'
            ).read_text() == text + '\n'
    assert json.loads(open(paths[1]).read()) == record


def test_write_report_output_and_data_dirs(tmp_path):
    """The report so far in the output folder (markdown with the summary
    table, the record, the results) and its copy in the data folder."""
    results = {'tests': True, 'fused': False}
    record = dict(env=ENV, complete=False, passed=False, results=results)
    lines = ['# mmpe gpu-check', '', f"on cuda ({ENV['device_name']})", '']
    out = tmp_path / 'out'
    out.mkdir()
    paths = gpu_checks.write_report(lines, record, str(out),
                                    str(tmp_path / 'data'))
    text = (out / 'report.md').read_text()
    assert text.startswith('\n'.join(lines))
    assert text.endswith('| tests | passed |\n| fused | FAILED |\n')
    assert json.loads((out / 'report.json').read_text()) == record
    assert json.loads((out / 'summary.json').read_text()) == results
    assert [os.path.basename(p) for p in paths] == [
        'gpu_check_nvidia-h100-80gb-hbm3.md',
        'gpu_check_nvidia-h100-80gb-hbm3.json']
    assert open(paths[0]).read() == text


@pytest.mark.parametrize('env,text,match', [
    ({k: v for k, v in ENV.items() if k != 'triton'}, ENV['device_name'],
     'triton'),
    (ENV, 'a report that names no device', 'does not name the device'),
])
def test_write_data_refuses_what_names_no_device_or_version(
        tmp_path, env, text, match):
    with pytest.raises(ValueError, match=match):
        gpu_checks.write_data(text, dict(env=env), str(tmp_path))
    assert not list(tmp_path.iterdir())


def test_device_slug():
    assert gpu_checks.device_slug('NVIDIA H200') == 'nvidia-h200'
    assert (gpu_checks.device_slug(' NVIDIA  H100 80GB HBM3 ')
            == 'nvidia-h100-80gb-hbm3')
    with pytest.raises(ValueError, match="'--'"):
        gpu_checks.device_slug('--')


@pytest.mark.skipif(not (interpreted() or torch.cuda.is_available()),
                    reason='Triton kernels need CUDA or TRITON_INTERPRET=1')
def test_check_fused_in_the_interpreter(monkeypatch):
    """The check's four settings, one float32 grid and the bfloat16 row:
    every row within its tolerance, and no fallback (a fallback's warning
    would fail its row)."""
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    if device.type == 'cpu':  # the CUDA backend, interpreted
        monkeypatch.setattr(choice, 'fused_backend', lambda _: 'fused-cuda')
    backend = ATTENTION_BACKENDS['fused-cuda']
    calls = []

    def run(request, run=backend.run):
        calls.append(request.q.dtype)
        return run(request)

    monkeypatch.setattr(backend, 'run', run)
    ok, lines, data = gpu_checks.check_fused(device, grids=((4, 5), ),
                                             bf16_grid=(4, 5))
    rows = data['rows']
    assert [(r['setting'], r['dtype']) for r in rows] == [
        (name, dtype) for name in gpu_checks.FUSED_SETTINGS
        for dtype in ('float32', 'bfloat16')]
    for r in rows:
        assert r['ok'] and not r['note'], r
        # output, dq, dk, dv and at least one parameter
        assert len(r['diffs']) >= 5
    assert ok
    # the Triton kernel ran every row: 4 settings x (1 grid + bfloat16)
    assert calls == [torch.float32, torch.bfloat16] * 4
    assert sum(line.endswith('| ok |') for line in lines) == len(rows)
