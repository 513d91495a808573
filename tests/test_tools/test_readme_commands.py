"""The README's commands work as written after ``make test``'s set-up.

The README's "Use the environment" block is run as a user would type it,
from the repository root, in a shell whose PATH has no virtual environment:
``source .venv/bin/activate``, then its ``python tools/train.py ...`` and
``python tools/test.py ...``; and its ``bash tools/dist_train.sh CONFIG 2
...`` *without* activating anything (the launcher finds ``.venv`` itself).
Only the work dirs are moved to a temporary folder and ``--cfg-options``
appended to shrink the run: a tiny generated data set, one epoch of two
iterations.
"""
import os
import os.path as osp
import re
import shlex
import subprocess
import sys

import pytest

from mmpe.datasets import generate_synthetic_coco
# the e2e tests' options: data root, batch 4, no workers, checkpoints
from test_train_test_e2e import _options  # noqa: E402 (tests/test_tools)

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
VENV = osp.join(ROOT, '.venv')

pytestmark = pytest.mark.slow


def test_make_test_created_the_venv():
    """The commands below need the repository's .venv (``make test``
    creates it): without it they fail, this test says why."""
    assert osp.isfile(osp.join(VENV, 'bin', 'activate')), \
        f'no {VENV}: run make test (it creates the environment)'


def readme_block() -> list:
    """The lines of the README code block that activates the environment."""
    with open(osp.join(ROOT, 'README.md')) as f:
        text = f.read()
    for block in re.findall(r'```bash\n(.*?)```', text, re.S):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        if lines and lines[0] == 'source .venv/bin/activate':
            return lines
    raise AssertionError('README.md has no ```bash block that starts with '
                         '`source .venv/bin/activate`')


def readme_command(prefix: str) -> list:
    lines = [line for line in readme_block() if line.startswith(prefix)]
    assert lines, f'no `{prefix} ...` line in the README block'
    return shlex.split(lines[0])


def user_env() -> dict:
    """The caller's environment with no Python environment active: no
    virtual env on PATH, no PYTHON / PYTHONPATH / VIRTUAL_ENV."""
    venvs = {
        osp.realpath(p)
        for p in (VENV, sys.prefix, os.environ.get('VIRTUAL_ENV', ''))
        if p
    }
    path = [
        p for p in os.environ.get('PATH', '').split(os.pathsep)
        if p and not any(
            osp.realpath(p).startswith(v + os.sep) for v in venvs)
    ]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ('PYTHON', 'PYTHONPATH', 'PYTHONHOME', 'VIRTUAL_ENV',
                     'MMPE_VENV')
    }
    env.update(PATH=os.pathsep.join(path), OMP_NUM_THREADS='1')
    return env


def with_work_dir(cmd: list, work_dir: str) -> list:
    cmd = list(cmd)
    i = cmd.index('--work-dir')
    cmd[i + 1] = work_dir
    return cmd


def shrink(data_root: str) -> list:
    """--cfg-options for one epoch of two iterations on ``data_root``."""
    return ['--cfg-options', *_options(data_root, max_epochs=1)]


def run_shell(script: str, env: dict) -> str:
    proc = subprocess.run(['bash', '-c', script],
                          cwd=ROOT,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f'{script}\n{log[-5000:]}'
    return log


@pytest.fixture(scope='module')
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp('readme_data')
    generate_synthetic_coco(
        str(root), num_train=8, num_val=4, seed=7, min_size=96, max_size=128)
    return str(root)


def test_without_activation_there_is_no_venv_python():
    # the shell of these tests: activation is what puts .venv's python first
    env = user_env()
    out = run_shell('source .venv/bin/activate && command -v python', env)
    assert osp.realpath(out.strip().splitlines()[-1]) == osp.realpath(
        osp.join(VENV, 'bin', 'python'))
    assert VENV not in env['PATH']


def test_readme_train_then_test_after_activation(tiny_data, tmp_path):
    train = readme_command('python tools/train.py ')
    work_dir = str(tmp_path / 'my_run')
    cmd = with_work_dir(train, work_dir) + shrink(tiny_data)
    run_shell('source .venv/bin/activate && ' + shlex.join(cmd), user_env())
    ckpt = osp.join(work_dir, 'epoch_1.pth')
    assert osp.isfile(ckpt)

    test = readme_command('python tools/test.py ')
    assert test[2] == 'configs/quickstart/detr_irpe_r18_synthetic.py'
    test[3] = ckpt  # the README names epoch_20.pth of its 20-epoch run
    cmd = test + ['--work-dir', str(tmp_path / 'test')] + shrink(tiny_data)
    log = run_shell('source .venv/bin/activate && ' + shlex.join(cmd),
                    user_env())
    assert 'coco/bbox_mAP' in log


def test_readme_dist_train_two_processes_without_activation(
        tiny_data, tmp_path, free_port):
    dist = readme_command('bash tools/dist_train.sh ')
    assert dist[3] == '2', dist  # CONFIG 2: two processes
    work_dir = str(tmp_path / 'my_ddp_run')
    cmd = with_work_dir(dist, work_dir) + shrink(tiny_data)
    env = user_env()
    env['PORT'] = str(free_port)
    log = run_shell(shlex.join(cmd), env)
    assert 'Distributed training: True' in log or 'world_size: 2' in log, \
        log[-3000:]
    assert osp.isfile(osp.join(work_dir, 'epoch_1.pth'))
