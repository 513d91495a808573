"""Unit tests of the cluster pieces, in process: atomic writes, the choice of
the checkpoint ``--resume`` continues from, the preemption hook's arguments,
and the batch sampler that skips a resumed epoch's first batches."""
import multiprocessing
import os
import os.path as osp
import select
import signal
import time
from types import SimpleNamespace

import pytest
import torch
from mmengine.fileio import get_file_backend
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from mmpe.engine import (ATOMIC_BACKEND, AtomicLocalBackend, PreemptionHook,
                         SignalTolerantWorkerInit, TrainingFlag,
                         checkpoint_load_error, find_resumable_checkpoint,
                         resume_candidates)
from mmpe.engine.resumable_loop import SkipFirstBatches, remainder_loader
from mmpe.utils import atomic_write, is_temporary_name


def test_atomic_write_replaces_whole_files(tmp_path):
    path = tmp_path / 'sub' / 'f.bin'
    atomic_write(b'old', path)
    atomic_write('new text', path)
    assert path.read_bytes() == b'new text'
    assert os.listdir(tmp_path / 'sub') == ['f.bin']


def test_failed_atomic_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / 'f.bin'
    atomic_write(b'old', path)

    def fail(fd):
        raise OSError('disk full')

    monkeypatch.setattr(os, 'fsync', fail)  # fails after the data went out
    with pytest.raises(OSError, match='disk full'):
        atomic_write(b'new', path)
    assert path.read_bytes() == b'old'
    assert os.listdir(tmp_path) == ['f.bin']  # no temporary file left
    with pytest.raises(TypeError, match='bytes or str'):
        atomic_write(3, path)


def test_atomic_backend_is_registered_under_its_own_name(tmp_path):
    backend = get_file_backend(
        str(tmp_path), backend_args=dict(backend=ATOMIC_BACKEND))
    assert isinstance(backend, AtomicLocalBackend)
    backend.put(b'abc', str(tmp_path / 'x.pth'))
    backend.put_text('p', str(tmp_path / 'last_checkpoint'))
    assert (tmp_path / 'x.pth').read_bytes() == b'abc'
    assert (tmp_path / 'last_checkpoint').read_text() == 'p'
    # the default local backend is untouched
    assert type(get_file_backend(str(tmp_path))).__name__ == 'LocalBackend'


def test_temporary_names():
    assert is_temporary_name('/w/.epoch_3.pth.1234.mmpe-tmp')
    assert not is_temporary_name('/w/epoch_3.pth')
    assert not is_temporary_name('/w/.epoch_3.pth.mmpe-tmp')
    assert not is_temporary_name('/w/.hidden')


def _checkpoint(path, mtime, epoch=1):
    torch.save(
        dict(meta=dict(epoch=epoch, iter=2 * epoch),
             state_dict=dict(w=torch.ones(3) * epoch)), path)
    os.utime(path, ns=(mtime, mtime))


def _truncate(path):
    with open(path, 'rb') as f:
        data = f.read()
    with open(path, 'wb') as f:
        f.write(data[:len(data) // 2])
    return data[:len(data) // 2]


def test_candidates_newest_first_without_best(tmp_path):
    w = str(tmp_path)
    _checkpoint(osp.join(w, 'epoch_1.pth'), 10**18)
    _checkpoint(osp.join(w, 'iter_7.pth'), 3 * 10**18)
    _checkpoint(osp.join(w, 'epoch_2.pth'), 2 * 10**18)
    _checkpoint(osp.join(w, 'best_coco_bbox_mAP_epoch_2.pth'), 4 * 10**18)
    assert [osp.basename(p) for p in resume_candidates(w)] == [
        'iter_7.pth', 'epoch_2.pth', 'epoch_1.pth'
    ]


def test_pointer_file_comes_first(tmp_path):
    w = str(tmp_path)
    _checkpoint(osp.join(w, 'epoch_1.pth'), 10**18)
    # e.g. a published copy, written after the last regular checkpoint
    _checkpoint(osp.join(w, 'epoch_1-0123abcd.pth'), 2 * 10**18)
    (tmp_path / 'last_checkpoint').write_text(osp.join(w, 'epoch_1.pth'))
    assert [osp.basename(p) for p in resume_candidates(w)] == [
        'epoch_1.pth', 'epoch_1-0123abcd.pth'
    ]
    assert find_resumable_checkpoint(w) == (osp.join(w, 'epoch_1.pth'), [])


def test_resume_skips_bad_newest_and_keeps_it(tmp_path):
    w = str(tmp_path)
    good, bad = osp.join(w, 'epoch_1.pth'), osp.join(w, 'epoch_2.pth')
    _checkpoint(good, 10**18, 1)
    _checkpoint(bad, 2 * 10**18, 2)
    bad_bytes = _truncate(bad)
    (tmp_path / 'last_checkpoint').write_text(bad)
    path, notes = find_resumable_checkpoint(w)
    assert path == good
    assert len(notes) == 1 and bad in notes[0]
    assert 'central directory' in notes[0]
    assert (tmp_path / 'epoch_2.pth.unloadable').read_bytes() == bad_bytes
    assert not osp.exists(bad)
    # a second set-aside of the same name does not overwrite the first
    _checkpoint(bad, 3 * 10**18, 2)
    _truncate(bad)
    path, notes = find_resumable_checkpoint(w)
    assert path == good and 'epoch_2.pth.unloadable.1' in notes[-1]
    assert (tmp_path / 'epoch_2.pth.unloadable').read_bytes() == bad_bytes


def test_resume_on_other_ranks_renames_nothing(tmp_path, monkeypatch):
    w = str(tmp_path)
    _checkpoint(osp.join(w, 'epoch_1.pth'), 10**18, 1)
    _checkpoint(osp.join(w, 'epoch_2.pth'), 2 * 10**18, 2)
    _truncate(osp.join(w, 'epoch_2.pth'))
    monkeypatch.setenv('RANK', '1')
    path, notes = find_resumable_checkpoint(w)
    assert path == osp.join(w, 'epoch_1.pth')
    assert osp.exists(osp.join(w, 'epoch_2.pth')) and 'kept' not in notes[0]


def test_resume_when_nothing_loads_renames_nothing(tmp_path):
    w = str(tmp_path)
    _checkpoint(osp.join(w, 'epoch_1.pth'), 10**18)
    _truncate(osp.join(w, 'epoch_1.pth'))
    (tmp_path / 'iter_3.pth').write_bytes(b'')
    with pytest.raises(RuntimeError, match='no checkpoint') as err:
        find_resumable_checkpoint(w)
    assert 'epoch_1.pth' in str(err.value) and 'iter_3.pth' in str(err.value)
    assert sorted(os.listdir(w)) == ['epoch_1.pth', 'iter_3.pth']


def test_resume_without_checkpoints_and_dangling_pointer(tmp_path):
    w = str(tmp_path)
    assert find_resumable_checkpoint(w) == (None, [])
    (tmp_path / 'last_checkpoint').write_text(osp.join(w, 'epoch_9.pth'))
    path, notes = find_resumable_checkpoint(w)
    assert path is None and 'epoch_9.pth' in notes[0]
    _checkpoint(osp.join(w, 'epoch_1.pth'), 10**18)
    path, notes = find_resumable_checkpoint(w)
    assert path == osp.join(w, 'epoch_1.pth') and 'epoch_9.pth' in notes[0]


def test_load_error_reasons(tmp_path):
    torch.save(dict(a=1), tmp_path / 'weights.pth')
    assert 'not a training checkpoint' in checkpoint_load_error(
        str(tmp_path / 'weights.pth'))
    assert 'FileNotFoundError' in checkpoint_load_error(
        str(tmp_path / 'missing.pth'))
    _checkpoint(str(tmp_path / 'ok.pth'), 10**18)
    assert checkpoint_load_error(str(tmp_path / 'ok.pth')) is None


def test_preemption_hook_arguments():
    assert PreemptionHook().signals == ('SIGTERM', 'SIGUSR1')
    assert PreemptionHook('SIGUSR2').signals == ('SIGUSR2', )
    with pytest.raises(ValueError, match=r"Unsupported `signals` entry "
                       r"'SIGKILL', please choose from \('SIGTERM'"):
        PreemptionHook(('SIGTERM', 'SIGKILL'))
    with pytest.raises(ValueError, match='empty'):
        PreemptionHook(())


def test_preemption_hook_records_and_restores_handlers():
    hook = PreemptionHook(('SIGUSR1', ))
    before = signal.getsignal(signal.SIGUSR1)
    runner = SimpleNamespace(train_loop=None)  # no loaders to protect
    hook.before_train(runner)
    try:
        assert hook.received is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert hook.received == 'SIGUSR1'
    finally:
        hook.after_train(runner)
    assert signal.getsignal(signal.SIGUSR1) is before


def _worker(init, ready):
    # Idle until killed, woken by every signal. Not time.sleep: the kernel
    # may deliver a process-directed signal to any thread that does not
    # block it (a spawned worker has torch's threads; the main thread is
    # passed over while a first signal is still pending on it), and a
    # Python handler runs only in the main thread, when it next executes
    # bytecode: a main thread asleep in one long C call would run it only
    # when the call returns. The wakeup fd is written by the C-level
    # handler in whichever thread takes the signal, so select returns and
    # the handlers run. Set before the handlers are installed: no signal
    # after them is missed.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    init(0)
    ready.set()
    while True:  # the test kills this process
        select.select([wake_r], [], [])
        os.read(wake_r, 64)


#: Hang guard only (never the thing asserted): how long a test waits for an
#: event that, when the code works, comes as soon as the OS schedules the
#: processes, so minutes beyond anything a loaded machine takes.
HANG_GUARD_S = 600


def _wait_until(predicate, what):
    deadline = time.monotonic() + HANG_GUARD_S
    while not predicate():
        assert time.monotonic() < deadline, \
            f'hang guard ({HANG_GUARD_S} s): {what}'
        time.sleep(0.01)


@pytest.mark.parametrize('context', ['fork', 'spawn'])
def test_workers_ignore_signals_only_while_training(context):
    # what the OS reports: a worker that ignores SIGTERM is still alive
    # after it; one that does not ends with -SIGTERM (its default action)
    ctx = multiprocessing.get_context(context)
    flag = TrainingFlag()
    calls = []
    init = SignalTolerantWorkerInit(('SIGTERM', 'SIGUSR1'), flag,
                                    calls.append)
    previous = {s: signal.getsignal(s)
                for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        init(7)  # in this process: it calls the wrapped function
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert calls == [7]
    flag.set(True)
    ready = ctx.Event()
    worker_init = SignalTolerantWorkerInit(('SIGTERM', 'SIGUSR1'), flag)
    proc = ctx.Process(target=_worker, args=(worker_init, ready))
    proc.start()
    try:
        assert ready.wait(HANG_GUARD_S), \
            f'hang guard ({HANG_GUARD_S} s): the worker never started'
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            os.kill(proc.pid, sig)
        # the worker records each signal it ignored in shared memory: wait
        # for both records, however late the worker is scheduled
        _wait_until(
            lambda: (worker_init.ignored(0, 'SIGTERM') == 1
                     and worker_init.ignored(0, 'SIGUSR1') == 1)
            or not proc.is_alive(), 'the worker never took the signals')
        assert proc.is_alive()  # ignored: the main process still trains
        flag.set(False)  # shared memory: the worker sees it
        proc.terminate()  # what multiprocessing does at exit
        proc.join(HANG_GUARD_S)  # hang guard: it ends at once
        assert proc.exitcode == -signal.SIGTERM
        assert worker_init.ignored(0, 'SIGTERM') == 1  # not counted then
    finally:
        if proc.is_alive():
            proc.kill()


def test_hook_protects_loaders_with_workers_only():
    with_workers = DataLoader(list(range(4)), num_workers=2,
                              worker_init_fn=print)
    without = DataLoader(list(range(4)), num_workers=0)
    runner = SimpleNamespace(
        train_loop=SimpleNamespace(dataloader=with_workers),
        val_loop=SimpleNamespace(dataloader=without))
    hook = PreemptionHook(('SIGUSR2', ))
    hook.before_train(runner)
    try:
        init = with_workers.worker_init_fn
        assert isinstance(init, SignalTolerantWorkerInit)
        assert init.worker_init_fn is print and init.signals == ('SIGUSR2', )
        assert init.num_workers == 2  # a row of counters per worker
        assert init.flag.is_set() and without.worker_init_fn is None
        hook.before_train(runner)  # not wrapped twice
        assert with_workers.worker_init_fn.worker_init_fn is print
    finally:
        hook.after_train(runner)
    assert not init.flag.is_set()


def test_skip_first_batches_and_remainder_loader():
    dataset = list(range(10))
    batches = BatchSampler(SequentialSampler(dataset), 3, drop_last=False)
    want = list(batches)  # [0,1,2] [3,4,5] [6,7,8] [9]
    skip = SkipFirstBatches(batches, 2)
    assert list(skip) == want[2:] and len(skip) == 2
    assert len(SkipFirstBatches(batches, 9)) == 0
    loader = DataLoader(dataset, batch_sampler=batches, num_workers=0)
    rest = [b.tolist() for b in remainder_loader(loader, 1)]
    assert rest == want[1:]


class _Runner:
    """What AtomicCheckpointHook uses of a Runner; save_checkpoint records
    which checkpoints existed while each one was written."""

    def __init__(self, work_dir):
        import logging
        from mmengine.logging import MessageHub
        self.work_dir = work_dir
        # a hub of its own: MessageHub instances are global by name, and a
        # shared one would carry keep_ckpt_ids from test to test
        self.message_hub = MessageHub.get_instance(
            f'test_atomic_hook:{work_dir}')
        self.logger = logging.getLogger('test_atomic_hook')
        self.seen = []

    def save_checkpoint(self, out_dir, filename, backend_args=None, **kw):
        self.seen.append(sorted(os.listdir(out_dir)))
        backend = get_file_backend(out_dir, backend_args=backend_args)
        backend.put(b'ckpt ' + filename.encode(), osp.join(out_dir, filename))


def test_checkpoint_hook_rotates_after_writing(tmp_path):
    from mmpe.engine import AtomicCheckpointHook
    w = str(tmp_path)
    (tmp_path / '.epoch_9.pth.123.mmpe-tmp').write_bytes(b'partial')
    runner = _Runner(w)
    hook = AtomicCheckpointHook(interval=1, max_keep_ckpts=1)
    hook.before_train(runner)
    assert hook.atomic and os.listdir(w) == []  # stale partial write removed
    hook._save_checkpoint_with_step(runner, 1, {})
    hook._save_checkpoint_with_step(runner, 2, {})
    # MMEngine's hook removes epoch_1.pth before writing epoch_2.pth
    assert runner.seen == [[], ['epoch_1.pth', 'last_checkpoint']]
    assert sorted(os.listdir(w)) == ['epoch_2.pth', 'last_checkpoint']
    assert (tmp_path / 'last_checkpoint').read_text() == osp.join(
        w, 'epoch_2.pth')
    assert runner.message_hub.get_info('keep_ckpt_ids') == [2]
    path = hook.save_resumable(runner, 'iter_5.pth')
    assert path == osp.join(w, 'iter_5.pth')
    assert (tmp_path / 'last_checkpoint').read_text() == path
    assert sorted(os.listdir(w)) == [
        'epoch_2.pth', 'iter_5.pth', 'last_checkpoint'
    ]


def test_checkpoint_hook_publishes_atomically(tmp_path):
    from mmpe.engine import AtomicCheckpointHook
    w = str(tmp_path)
    hook = AtomicCheckpointHook(
        interval=1, published_keys=['meta', 'state_dict'])
    hook.before_train(_Runner(w))
    torch.save(
        dict(meta=dict(epoch=1), state_dict=dict(w=torch.ones(2)),
             optimizer=dict(lr=0.1)), tmp_path / 'epoch_1.pth')
    hook._publish_model(None, osp.join(w, 'epoch_1.pth'))
    published = [n for n in os.listdir(w) if n.startswith('epoch_1-')]
    assert len(published) == 1 and published[0].endswith('.pth')
    ck = torch.load(tmp_path / published[0], weights_only=True)
    assert sorted(ck) == ['meta', 'state_dict']
    assert not [n for n in os.listdir(w) if is_temporary_name(n)]
