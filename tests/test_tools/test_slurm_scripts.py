"""tools/slurm_train.sh and tools/slurm_test.sh build the right ``srun``
call, and slurm_train.sh requeues after exit status 75 (preempted, checkpoint
saved): checked with stand-in ``srun`` / ``scontrol`` on PATH that record
their arguments and answer with scripted exit statuses."""
import os
import os.path as osp
import stat
import subprocess

import pytest

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
TOOLS = osp.join(ROOT, 'tools')

# Appends its arguments (one per line, then a separator line) to $CALLS and
# exits with the next status from $STATUSES (one per line; 0 when used up).
STAND_IN = r'''#!/usr/bin/env bash
{ printf '%s\n' "$(basename "$0")" "$@"; echo '----'; } >> "$CALLS"
n=$(grep -c '^----$' "$CALLS")
status=$(sed -n "${n}p" "$STATUSES" 2>/dev/null)
exit "${status:-0}"
'''


@pytest.fixture
def slurm(tmp_path):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    for name in ('srun', 'scontrol'):
        path = bin_dir / name
        path.write_text(STAND_IN)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    calls, statuses = tmp_path / 'calls', tmp_path / 'statuses'

    def run(script, *args, statuses_=(), **env):
        statuses.write_text(''.join(f'{s}\n' for s in statuses_))
        if calls.exists():
            calls.unlink()
        full_env = {
            k: v
            for k, v in os.environ.items() if not k.startswith('SLURM_')
            and k not in ('GPUS', 'GPUS_PER_NODE', 'SRUN_ARGS')
        }
        full_env.update(
            PATH=f'{bin_dir}:{os.environ["PATH"]}',
            CALLS=str(calls),
            STATUSES=str(statuses),
            PYTHON='python',
            **env)
        proc = subprocess.run(['bash', osp.join(TOOLS, script), *args],
                              env=full_env,
                              capture_output=True,
                              text=True,
                              timeout=300)  # hang guard
        recorded = []
        if calls.exists():
            for block in calls.read_text().split('----\n'):
                if block:
                    recorded.append(block.rstrip('\n').split('\n'))
        return proc, recorded

    return run


def _train_call(partition, job, gpus, per_node, config, work_dir, *extra,
                signal='USR1@120', cpus=5, srun_args=()):
    return [
        'srun', '-p', partition, f'--job-name={job}', f'--gres=gpu:{per_node}',
        f'--ntasks={gpus}', f'--ntasks-per-node={per_node}',
        f'--cpus-per-task={cpus}', '--kill-on-bad-exit=1',
        f'--signal={signal}', *srun_args, 'python', '-u',
        osp.join(TOOLS, 'train.py'), config, f'--work-dir={work_dir}',
        '--launcher=slurm', '--resume', *extra
    ]


def test_train_arguments_become_one_srun_call(slurm):
    proc, calls = slurm('slurm_train.sh', 'gpu', 'detr', 'configs/a b.py',
                        'work_dirs/x', '4', '--cfg-options',
                        'train_cfg.max_epochs=2', '--amp')
    assert proc.returncode == 0, proc.stderr
    assert calls == [
        _train_call('gpu', 'detr', 4, 4, 'configs/a b.py', 'work_dirs/x',
                    '--cfg-options', 'train_cfg.max_epochs=2', '--amp')
    ]


def test_train_defaults_and_environment(slurm):
    # no GPUS argument: 8 tasks; 16 tasks span nodes of 8
    _, calls = slurm('slurm_train.sh', 'p', 'j', 'c.py', 'w', '--amp')
    assert calls == [_train_call('p', 'j', 8, 8, 'c.py', 'w', '--amp')]
    _, calls = slurm('slurm_train.sh', 'p', 'j', 'c.py', 'w', '16')
    assert calls == [_train_call('p', 'j', 16, 8, 'c.py', 'w')]
    _, calls = slurm(
        'slurm_train.sh',
        'p',
        'j',
        'c.py',
        'w',
        '2',
        CPUS_PER_TASK='3',
        SIGNAL='TERM',
        SIGNAL_TIME='300',
        SRUN_ARGS='--time=1:00:00 --qos=low')
    assert calls == [
        _train_call(
            'p',
            'j',
            2,
            2,
            'c.py',
            'w',
            cpus=3,
            signal='TERM@300',
            srun_args=('--time=1:00:00', '--qos=low'))
    ]


def test_train_runs_again_after_preemption_status(slurm):
    proc, calls = slurm(
        'slurm_train.sh', 'p', 'j', 'c.py', 'w', '2', statuses_=(75, 75, 0))
    assert proc.returncode == 0
    want = _train_call('p', 'j', 2, 2, 'c.py', 'w')
    assert calls == [want, want, want]
    assert 'preempted' in proc.stderr


def test_train_failure_is_not_retried(slurm):
    proc, calls = slurm('slurm_train.sh', 'p', 'j', 'c.py', 'w', statuses_=(1, ))
    assert proc.returncode == 1 and len(calls) == 1


def test_train_stops_after_max_requeues(slurm):
    proc, calls = slurm(
        'slurm_train.sh',
        'p',
        'j',
        'c.py',
        'w',
        statuses_=(75, 75, 75, 0),
        MAX_REQUEUES='2')
    assert proc.returncode == 75 and len(calls) == 3
    assert 'MAX_REQUEUES=2' in proc.stderr


def test_train_in_batch_job_requeues_the_job(slurm):
    proc, calls = slurm(
        'slurm_train.sh',
        'p',
        'j',
        'c.py',
        'w',
        '2',
        statuses_=(75, 0),
        SLURM_JOB_ID='4242')
    assert proc.returncode == 75
    assert calls == [
        _train_call('p', 'j', 2, 2, 'c.py', 'w'),
        ['scontrol', 'requeue', '4242']
    ]


def test_test_arguments_become_one_srun_call(slurm):
    proc, calls = slurm('slurm_test.sh', 'gpu', 'eval', 'c.py', 'w/epoch_3.pth',
                        '2', '--out', 'r.pkl')
    assert proc.returncode == 0, proc.stderr
    assert calls == [[
        'srun', '-p', 'gpu', '--job-name=eval', '--gres=gpu:2', '--ntasks=2',
        '--ntasks-per-node=2', '--cpus-per-task=5', '--kill-on-bad-exit=1',
        'python', '-u',
        osp.join(TOOLS, 'test.py'), 'c.py', 'w/epoch_3.pth',
        '--launcher=slurm', '--out', 'r.pkl'
    ]]


@pytest.mark.parametrize('script', ['slurm_train.sh', 'slurm_test.sh'])
def test_missing_arguments_print_usage(slurm, script):
    proc, calls = slurm(script, 'p', 'j', 'c.py')
    assert proc.returncode == 2 and calls == []
    assert 'usage:' in proc.stderr
