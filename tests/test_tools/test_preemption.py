"""End to end on a preemptible cluster's failure modes (tools/train.py in
subprocesses, CPU, tiny data, ``num_workers=0``):

* SIGKILL while a checkpoint is being written (the test's own hook makes
  the write of the second checkpoint stop half way, at a known point, and
  say so): no file under a checkpoint name is partial at that moment, and
  ``--resume`` continues and finishes;
* a truncated newest checkpoint: ``--resume`` names it and why, continues
  from the previous one and finishes, and the bad bytes are kept;
  ``--resume PATH`` of that file stops with status 2 naming path and reason;
* SIGTERM in the middle of an epoch: ``iter_N.pth`` of that iteration, exit
  status 75, and the resumed run's losses equal an uninterrupted run's;
* SIGTERM to every process of the run (as Slurm sends it) with dataloader
  workers: the workers survive until the checkpoint is written, and a run
  with workers that fails still exits and leaves no worker behind.
"""
import glob
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import torch

from test_train_test_e2e import (CONFIG, ROOT, _losses,  # noqa: F401
                                 _options, tiny_data)

pytestmark = pytest.mark.slow

PREEMPTED = 75

#: Hang guard only (never the thing asserted): how long the test waits for
#: an event of the run it started.
HANG_GUARD_S = 600

# Hooks of the tests' own configs (imported through custom_imports).
TEST_HOOKS = r'''
import os
import signal
import time

from mmengine.hooks import Hook
from mmdet.registry import HOOKS


class _HalfWrite:
    """A file opened for writing whose first write stores half of the data,
    flushes it to disk, creates `stopped`, then waits to be killed."""

    def __init__(self, f, stopped):
        self.f, self.stopped = f, stopped

    def write(self, data):
        self.f.write(data[:len(data) // 2])
        self.f.flush()
        os.fsync(self.f.fileno())
        with open(self.stopped + '.part', 'w') as out:
            out.write(self.f.name)
        os.replace(self.stopped + '.part', self.stopped)  # whole when seen
        while True:  # the test kills this process (SIGKILL)
            signal.pause()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def __getattr__(self, name):
        return getattr(self.f, name)


@HOOKS.register_module()
class StopMidWriteHook(Hook):
    """Stop the process half way through writing the checkpoint of epoch
    `epoch`: the next file mmpe's atomic writer opens (that checkpoint's
    temporary file) gets half of its bytes, then `flag_dir/stopped` names
    it and the process waits for its SIGKILL. Once: a run that finds
    `stopped` (the resumed one) writes normally."""

    def __init__(self, epoch, flag_dir):
        self.epoch, self.flag_dir = epoch, flag_dir

    def before_save_checkpoint(self, runner, checkpoint):
        stopped = os.path.join(self.flag_dir, 'stopped')
        if checkpoint['meta']['epoch'] != self.epoch or \
                os.path.exists(stopped):
            return
        from mmpe.utils import atomic_files

        def open_half(path, mode='r', *args, **kwargs):
            assert mode == 'wb', mode
            return _HalfWrite(open(path, mode, *args, **kwargs), stopped)

        # a module global shadows the builtin in atomic_write's lookup
        atomic_files.open = open_half


def wait_until(predicate, what, hang_guard_s=600):
    deadline = time.monotonic() + hang_guard_s
    while not predicate():
        assert time.monotonic() < deadline, 'hung: ' + what
        time.sleep(0.02)


@HOOKS.register_module()
class PauseAtIterHook(Hook):
    """After iteration `at` write `reached`, then wait for `go` (the test
    sends its signal in between) and, with `worker_signal`, until every
    train dataloader worker has recorded that it ignored that signal."""

    def __init__(self, at, flag_dir, worker_signal=None):
        self.at, self.flag_dir = at, flag_dir
        self.worker_signal = worker_signal

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        if runner.iter + 1 != self.at:
            return
        open(os.path.join(self.flag_dir, 'reached'), 'w').close()
        wait_until(
            lambda: os.path.exists(os.path.join(self.flag_dir, 'go')),
            'the test sent no signal')
        if self.worker_signal:
            init = runner.train_loop.dataloader.worker_init_fn
            wait_until(
                lambda: all(
                    init.ignored(w, self.worker_signal)
                    for w in range(init.num_workers)),
                'a worker never took ' + self.worker_signal)


@HOOKS.register_module()
class FailAtIterHook(Hook):
    """Raise after iteration `at` (a training that crashes)."""

    def __init__(self, at):
        self.at = at

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        if runner.iter + 1 == self.at:
            raise RuntimeError('test failure at iteration %d' % self.at)
'''


def _write_config(tmp_path, name, hooks):
    (tmp_path / 'preempt_test_hooks.py').write_text(TEST_HOOKS)
    path = tmp_path / name
    path.write_text(
        f'_base_ = [{CONFIG!r}]\n'
        "custom_imports = dict(imports=['mmpe', 'preempt_test_hooks'], "
        'allow_failed_imports=False)\n'
        f"custom_hooks = [dict(type='RNGStateHook'), {hooks}]\n")
    return str(path)


def _env(tmp_path):
    return dict(
        os.environ,
        OMP_NUM_THREADS='1',
        PYTHONHASHSEED='0',
        PYTHONPATH=f'{tmp_path}:{os.environ.get("PYTHONPATH", "")}')


def _train_cmd(config, work_dir, data_root, max_epochs, resume=None,
               extra=()):
    cmd = [sys.executable, 'tools/train.py', config, '--work-dir', work_dir]
    if resume == 'auto':
        cmd.append('--resume')
    elif resume:
        cmd += ['--resume', resume]
    return cmd + ['--cfg-options', *_options(data_root, max_epochs, extra)]


def _run(cmd, env, status=0):
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == status, \
        f'status {proc.returncode}\n' + proc.stdout[-3000:] + \
        proc.stderr[-5000:]
    return proc


def _loads(path):
    return torch.load(path, map_location='cpu', weights_only=True)


def _checkpoint_names(work_dir):
    return sorted(
        osp.basename(p) for p in glob.glob(osp.join(work_dir, '*.pth')))


def _pointer(work_dir):
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        return f.read().strip()


def test_sigkill_while_writing_a_checkpoint(tiny_data, tmp_path):
    flags = tmp_path / 'flags'
    flags.mkdir()
    config = _write_config(
        tmp_path, 'stop.py',
        f"dict(type='StopMidWriteHook', epoch=2, flag_dir={str(flags)!r})")
    work_dir = str(tmp_path / 'run')
    env = _env(tmp_path)
    log = tmp_path / 'train.log'
    with open(log, 'w') as out:  # a file: a full pipe would block the run
        proc = subprocess.Popen(
            _train_cmd(config, work_dir, tiny_data, 2),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT)
    first = osp.join(work_dir, 'epoch_1.pth')
    stopped = flags / 'stopped'
    try:
        # the hook writes `stopped` once half of epoch_2's bytes are on disk
        deadline = time.monotonic() + HANG_GUARD_S
        while not stopped.exists():
            assert proc.poll() is None, \
                'the run ended before the checkpoint write stopped: ' + \
                log.read_text()[-5000:]
            assert time.monotonic() < deadline, \
                f'hang guard ({HANG_GUARD_S} s): the write never stopped'
            time.sleep(0.05)
        # the moment of the kill: every file under a checkpoint name loads
        names = _checkpoint_names(work_dir)
        assert names == ['epoch_1.pth']
        for name in names:
            _loads(osp.join(work_dir, name))
        assert _pointer(work_dir) == first
        partial = stopped.read_text()
        partial_name = osp.basename(partial)
        assert osp.dirname(partial) == work_dir
        assert partial_name.startswith('.epoch_2.pth.')
        assert 0 < os.stat(partial).st_size < os.stat(first).st_size
    finally:
        proc.kill()  # SIGKILL
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    left = os.listdir(work_dir)
    assert partial_name in left  # the partial write is there, hidden

    resumed = _run(
        _train_cmd(config, work_dir, tiny_data, 2, resume='auto'), env)
    assert f'continuing from {first}' in resumed.stdout
    assert _checkpoint_names(work_dir) == ['epoch_1.pth', 'epoch_2.pth']
    ck = _loads(osp.join(work_dir, 'epoch_2.pth'))
    assert ck['meta']['epoch'] == 2 and ck['meta']['iter'] == 4
    assert _pointer(work_dir) == osp.join(work_dir, 'epoch_2.pth')
    # the killed run's partial file is cleaned up before training
    assert partial_name not in os.listdir(work_dir)


def test_truncated_latest_checkpoint_is_skipped(tiny_data, tmp_path):
    work_dir = str(tmp_path / 'run')
    env = _env(tmp_path)
    _run(_train_cmd(CONFIG, work_dir, tiny_data, 2), env)
    latest = osp.join(work_dir, 'epoch_2.pth')
    with open(latest, 'rb') as f:
        data = f.read()
    bad = data[:len(data) // 2]  # what a kill during an in-place write left
    with open(latest, 'wb') as f:
        f.write(bad)

    proc = _run(_train_cmd(CONFIG, work_dir, tiny_data, 3, resume='auto'), env)
    # MMPERunner chose the checkpoint and said so in the log
    warning = [ln for ln in proc.stdout.splitlines() if 'skipped' in ln]
    assert len(warning) == 1, proc.stdout[-3000:]
    assert latest in warning[0]
    assert 'central directory' in warning[0]  # torch's reason, passed on
    kept = latest + '.unloadable'
    assert f'kept as {kept}' in warning[0]
    assert f'continuing from {osp.join(work_dir, "epoch_1.pth")}' \
        in proc.stdout
    with open(kept, 'rb') as f:
        assert f.read() == bad  # never deleted nor overwritten
    # resumed at the end of epoch 1 and trained epochs 2 and 3 again
    assert _checkpoint_names(work_dir) == [
        'epoch_1.pth', 'epoch_2.pth', 'epoch_3.pth'
    ]
    ck = _loads(osp.join(work_dir, 'epoch_3.pth'))
    assert ck['meta']['epoch'] == 3 and ck['meta']['iter'] == 6
    losses = _losses(work_dir)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]

    # an explicit bad path stops before training, naming path and reason
    proc = _run(
        _train_cmd(CONFIG, work_dir, tiny_data, 4, resume=kept), env, 2)
    assert f'cannot resume from {kept}' in proc.stdout
    assert 'central directory' in proc.stdout
    assert 'Traceback' not in proc.stdout + proc.stderr
    assert _checkpoint_names(work_dir)[-1] == 'epoch_3.pth'


def _start_paused_at_2(tiny_data, tmp_path, env, extra, new_session=False,
                       worker_signal=None):
    """Start a 2-epoch run that pauses after iteration 2 (``PauseAtIterHook``)
    and wait until it is there; the caller signals, then touches ``go``.
    With ``worker_signal`` the run goes on only once every train dataloader
    worker has recorded that it ignored that signal."""
    flags = tmp_path / 'flags'
    flags.mkdir()
    config = _write_config(
        tmp_path, 'pause.py',
        f"dict(type='PauseAtIterHook', at=2, flag_dir={str(flags)!r}, "
        f'worker_signal={worker_signal!r})')
    part = str(tmp_path / 'part')
    proc = subprocess.Popen(
        _train_cmd(config, part, tiny_data, 2, extra=extra),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=new_session)
    deadline = time.monotonic() + HANG_GUARD_S
    while not (flags / 'reached').exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            what = (f'ended ({proc.returncode})' if proc.poll() is not None
                    else f'hang guard ({HANG_GUARD_S} s): never reached '
                    'iteration 2')
            proc.kill()
            raise AssertionError(f'the run {what}: ' +
                                 proc.communicate()[1][-3000:])
        time.sleep(0.05)
    return config, part, flags, proc


def test_sigterm_mid_epoch_checkpoints_and_resumes_exactly(
        tiny_data, tmp_path):
    # batch 2: 4 iterations an epoch; the signal comes after iteration 2
    extra = ('train_dataloader.batch_size=2', )
    env = _env(tmp_path)
    full = str(tmp_path / 'full')
    _run(_train_cmd(CONFIG, full, tiny_data, 2, extra=extra), env)

    config, part, flags, proc = _start_paused_at_2(tiny_data, tmp_path, env,
                                                   extra)
    try:
        proc.send_signal(signal.SIGTERM)
        (flags / 'go').touch()
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == PREEMPTED, (out + err)[-5000:]
    ckpt = osp.join(part, 'iter_2.pth')
    assert _checkpoint_names(part) == ['iter_2.pth']
    assert _pointer(part) == ckpt
    ck = _loads(ckpt)
    assert ck['meta']['epoch'] == 0 and ck['meta']['iter'] == 2
    assert 'optimizer' in ck and 'param_schedulers' in ck

    resumed = _run(
        _train_cmd(config, part, tiny_data, 2, resume='auto', extra=extra),
        env)
    assert 'Resuming epoch 1 at batch 3 of 4' in resumed.stdout + \
        resumed.stderr
    want, got = _losses(full), _losses(part)
    assert sorted(want) == list(range(1, 9))
    assert sorted(got) == sorted(want)
    for step in sorted(want):
        assert got[step] == pytest.approx(want[step], rel=1e-6, abs=1e-7), \
            f'iteration {step}: resumed {got[step]} vs {want[step]}'
    assert _checkpoint_names(part) == [
        'epoch_1.pth', 'epoch_2.pth', 'iter_2.pth'
    ]


WORKERS = ('train_dataloader.batch_size=2', 'train_dataloader.num_workers=2',
           'train_dataloader.persistent_workers=True')


def _group_gone(pgid, seconds=HANG_GUARD_S):
    """Whether every process of the group has exited within `seconds` (a
    hang guard: workers stop at once, or at torch's 5 s watchdog check)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_sigterm_to_every_process_with_workers(tiny_data, tmp_path):
    env = _env(tmp_path)
    # its own process group (start_new_session), workers included
    config, part, flags, proc = _start_paused_at_2(
        tiny_data, tmp_path, env, WORKERS, new_session=True,
        worker_signal='SIGTERM')
    try:
        workers = subprocess.run(['pgrep', '-g', str(proc.pid)],
                                 capture_output=True, text=True).stdout
        assert len(workers.split()) >= 3  # the main process and 2 workers
        os.killpg(proc.pid, signal.SIGTERM)  # as Slurm: every process
        # the run goes on once both workers recorded the signal (the hook)
        (flags / 'go').touch()
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == PREEMPTED, (out + err)[-5000:]
    assert 'killed by signal' not in out + err, (out + err)[-5000:]
    assert _checkpoint_names(part) == ['iter_2.pth']
    assert _group_gone(proc.pid)  # the workers stopped with the run

    resumed = subprocess.Popen(
        _train_cmd(config, part, tiny_data, 2, resume='auto',
                   extra=WORKERS),
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    out, err = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, (out + err)[-5000:]
    assert 'Resuming epoch 1 at batch 3 of 4' in out + err
    assert _checkpoint_names(part) == [
        'epoch_1.pth', 'epoch_2.pth', 'iter_2.pth'
    ]
    assert _group_gone(resumed.pid)


def test_failing_run_with_workers_exits_and_stops_them(tiny_data, tmp_path):
    config = _write_config(tmp_path, 'fail.py',
                           "dict(type='FailAtIterHook', at=2)")
    proc = subprocess.Popen(
        _train_cmd(config, str(tmp_path / 'run'), tiny_data, 2,
                   extra=WORKERS),
        cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=600)  # no hang at exit
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1 and 'test failure at iteration 2' in err
    assert _group_gone(proc.pid)
