"""mmpe.utils.bench_env: the record of where a benchmark ran, the same in
every script of tools/benchmark."""
import os
import platform
from datetime import datetime, timezone

import pytest
import torch

from mmpe.utils.bench_env import (TIMING_ENV_VARS, benchmark_device,
                                  benchmark_env, env_line, finish_env)


def test_record_of_this_process(monkeypatch):
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    monkeypatch.delenv('LD_PRELOAD', raising=False)
    before = datetime.now(timezone.utc).replace(microsecond=0)
    env = benchmark_env(torch.device('cpu'), backend='eager')
    assert before <= datetime.fromisoformat(env['date'])
    assert env['torch'] == torch.__version__ and env['device'] == 'cpu'
    assert env['device_name'] == (platform.processor() or platform.machine())
    assert env['cpu_count'] == os.cpu_count()
    assert env['threads'] == torch.get_num_threads()
    assert len(env['load_avg_start']) == 3
    assert env['env_vars'] == dict.fromkeys(TIMING_ENV_VARS) | {
        'OMP_NUM_THREADS': '1'}
    assert env['backend'] == 'eager'
    assert 'load_avg_end' not in env
    assert len(finish_env(env)['load_avg_end']) == 3
    assert env_line(env).startswith(f'torch {torch.__version__} on cpu (')


def test_device_and_threads():
    threads = torch.get_num_threads()
    try:
        assert benchmark_device('cpu', 1) == torch.device('cpu')
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    want = 'cuda' if torch.cuda.is_available() else 'cpu'
    assert benchmark_device('auto').type == want
    assert torch.get_num_threads() == threads  # None: unchanged


@pytest.mark.parametrize('device, threads, words', [
    ('gpu', None, "device 'gpu': choose from ('cpu', 'cuda', 'auto')"),
    ('cpu', 0, 'Unsupported `threads` 0, please choose an int > 0'),
    ('cpu', 2.0, 'Unsupported `threads` 2.0, please choose an int > 0'),
    ('cpu', True, 'Unsupported `threads` True (a bool), please choose an int'),
])
def test_bad_arguments_are_named(device, threads, words):
    with pytest.raises(ValueError) as err:
        benchmark_device(device, threads)
    assert words in str(err.value)
