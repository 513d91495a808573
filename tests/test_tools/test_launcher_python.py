"""Which Python the shell launchers start (tools/python_env.sh): ``$PYTHON``
when set, else the repository's ``.venv/bin/python`` when it exists (what
``make demo`` / ``make test`` create), else ``python`` from PATH.

The launchers are copied into a scratch repository whose ``.venv/bin/python``
and whose ``python`` / ``srun`` on PATH are stand-ins that record how they
were called, so no real interpreter, torchrun or Slurm is involved."""
import os
import os.path as osp
import shutil
import stat
import subprocess

import pytest

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
SCRIPTS = ('dist_train.sh', 'dist_test.sh', 'slurm_train.sh',
           'slurm_test.sh', 'slurm_args.sh', 'python_env.sh')

# Appends its own path and its arguments (one per line) and a separator line
# to $CALLS, then exits 0.
RECORDER = r'''#!/bin/sh
{ printf '%s\n' "$0" "$@"; echo '----'; } >> "$CALLS"
'''


def _recorder(path):
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(RECORDER)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


@pytest.fixture
def repo(tmp_path):
    """A scratch repository with the launchers in tools/ and stand-in
    ``python`` and ``srun`` on a PATH of their own."""
    tools = tmp_path / 'repo' / 'tools'
    tools.mkdir(parents=True)
    for name in SCRIPTS:
        shutil.copy(osp.join(ROOT, 'tools', name), tools / name)
    bin_dir = tmp_path / 'bin'
    for name in ('python', 'srun'):
        _recorder(str(bin_dir / name))
    calls = tmp_path / 'calls'

    def run(script, *args, venv=True, **env):
        if venv:
            _recorder(str(tmp_path / 'repo' / '.venv' / 'bin' / 'python'))
        if calls.exists():
            calls.unlink()
        full_env = {
            k: v
            for k, v in os.environ.items()
            if k not in ('PYTHON', 'MMPE_VENV', 'VIRTUAL_ENV', 'GPUS',
                         'GPUS_PER_NODE', 'SRUN_ARGS')
            and not k.startswith('SLURM_')
        }
        # bash, dirname and the coreutils, but no interpreter of the caller
        full_env.update(PATH=f'{bin_dir}:/usr/bin:/bin', CALLS=str(calls),
                        **env)
        proc = subprocess.run(['bash', str(tools / script), *args],
                              env=full_env,
                              capture_output=True,
                              text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        blocks = calls.read_text().split('----\n')
        return [b.rstrip('\n').split('\n') for b in blocks if b]

    run.root = str(tmp_path / 'repo')
    run.bin = str(bin_dir)
    return run


def test_dist_train_uses_the_repository_venv(repo):
    calls = repo('dist_train.sh', 'configs/x.py', '2', '--work-dir', 'w')
    venv_python = osp.join(repo.root, '.venv', 'bin', 'python')
    assert len(calls) == 1
    assert calls[0][0] == venv_python
    args = calls[0][1:]
    assert args[:2] == ['-m', 'torch.distributed.run']
    assert '--nproc_per_node=2' in args
    tool = args.index(osp.join(repo.root, 'tools', 'train.py'))
    assert args[tool + 1:] == [
        'configs/x.py', '--launcher', 'pytorch', '--work-dir', 'w'
    ]


def test_dist_test_uses_the_repository_venv(repo):
    calls = repo('dist_test.sh', 'configs/x.py', 'ckpt.pth', '2')
    assert calls[0][0] == osp.join(repo.root, '.venv', 'bin', 'python')
    tool = calls[0].index(osp.join(repo.root, 'tools', 'test.py'))
    assert calls[0][tool + 1:] == [
        'configs/x.py', 'ckpt.pth', '--launcher', 'pytorch'
    ]


def test_python_from_path_without_a_venv(repo):
    calls = repo('dist_train.sh', 'configs/x.py', '2', venv=False)
    assert calls[0][0] == osp.join(repo.bin, 'python')


def test_python_variable_wins(repo, tmp_path):
    mine = str(tmp_path / 'elsewhere' / 'python')
    _recorder(mine)
    calls = repo('dist_train.sh', 'configs/x.py', '2', PYTHON=mine)
    assert calls[0][0] == mine
    calls = repo('slurm_test.sh', 'p', 'j', 'c.py', 'ckpt.pth', '1',
                 PYTHON=mine)
    assert calls[0][0] == osp.join(repo.bin, 'srun')
    assert mine in calls[0]


def test_mmpe_venv_names_another_environment(repo, tmp_path):
    # tools/setup_env.sh builds $MMPE_VENV instead of .venv when it is set
    other = tmp_path / 'venvs' / 'mmpe'
    _recorder(str(other / 'bin' / 'python'))
    calls = repo('dist_train.sh', 'configs/x.py', '2', MMPE_VENV=str(other))
    assert calls[0][0] == str(other / 'bin' / 'python')


@pytest.mark.parametrize('script,arg4,tool', [
    ('slurm_train.sh', 'work_dirs/x', 'train.py'),
    ('slurm_test.sh', 'ckpt.pth', 'test.py'),
])
def test_slurm_scripts_run_the_venv_python(repo, script, arg4, tool):
    calls = repo(script, 'gpu', 'job', 'c.py', arg4, '2')
    assert len(calls) == 1 and calls[0][0] == osp.join(repo.bin, 'srun')
    venv_python = osp.join(repo.root, '.venv', 'bin', 'python')
    i = calls[0].index(venv_python)
    assert calls[0][i + 1:i + 3] == [
        '-u', osp.join(repo.root, 'tools', tool)
    ]
