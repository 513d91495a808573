"""Weights-only checkpoint loading (mmpe.engine.safe_checkpoint): plain,
stock-MMEngine and old-mmpe checkpoints load; code-running pickles are
refused unless the user opts in; nothing is patched outside the scope."""
import copy
import os
import os.path as osp
import pickle
import subprocess
import sys
import types
from collections import OrderedDict

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner.checkpoint import (CheckpointLoader, _load_checkpoint,
                                        load_checkpoint)

from mmpe.engine import (UNSAFE_LOAD_ENV, UnsafeCheckpointError, from_plain,
                         load_from_local_safe, rebuild_history_buffer,
                         safe_checkpoint_loading, to_plain)

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
SENTINEL_NAME = 'code_ran.txt'


class _RunsCode:
    """Unpickling this object writes a file: a stand-in for an exploit."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (_write_file, (self.path, ))


class _RunsShell:
    """Unpickling this object runs a shell command through os.system."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f'touch {self.path}', ))


def _write_file(path):
    with open(path, 'w') as f:
        f.write('pwned')
    return path


def _save_with(obj, path, override):
    """torch.save with a pickler that stores a value ``v`` as
    ``override(v)`` says unless that is NotImplemented (no process-wide
    copyreg)."""

    class Pickler(pickle.Pickler):

        def reducer_override(self, value):
            return override(value)

    torch.save(
        obj,
        path,
        pickle_module=types.SimpleNamespace(
            __name__='override_pickle', Pickler=Pickler))


def _for_buffers(reduce_history_buffer):
    return lambda v: reduce_history_buffer(v) if isinstance(
        v, HistoryBuffer) else NotImplemented


def _filled_buffer():
    buf = HistoryBuffer(max_length=5)
    for v in [0.5, 1.5, 2.5]:
        buf.update(v, count=2)
    return buf


def _assert_same_buffer(got, want):
    assert type(got) is HistoryBuffer
    assert got.max_length == want.max_length
    for g, w in zip(got.data, want.data):
        np.testing.assert_array_equal(g, w)
        assert g.dtype == w.dtype
    assert got.mean() == want.mean() and got.current() == want.current()


def test_history_buffer_round_trip_weights_only(tmp_path):
    buf = _filled_buffer()
    hub = MessageHub.get_instance('test_safe_ckpt')
    hub.update_scalar('train/loss', 3.0)
    hub.update_info('iter', 7)
    hub.update_info('eta', np.float64(12.5))
    ckpt = dict(
        meta=dict(epoch=1, iter=7, seed=0),
        message_hub=hub.state_dict(),
        buffer=buf,
        state_dict=OrderedDict(w=torch.randn(3)))
    path = str(tmp_path / 'ckpt.pth')
    torch.save(to_plain(ckpt), path)

    # Plain torch.load with the weights-only default must accept it.
    loaded = from_plain(torch.load(path, weights_only=True))
    _assert_same_buffer(loaded['buffer'], buf)
    new_hub = MessageHub.get_instance('test_safe_ckpt_loaded')
    new_hub.load_state_dict(loaded['message_hub'])
    assert new_hub.get_scalar('train/loss').current() == 3.0
    assert new_hub.get_info('iter') == 7
    eta = new_hub.get_info('eta')
    assert type(eta) is np.float64 and eta == 12.5


def test_history_buffer_deepcopy_still_works():
    buf = HistoryBuffer()
    buf.update(1.0)
    copied = copy.deepcopy(buf)
    copied.update(3.0)
    assert buf.current() == 1.0 and copied.mean() == 2.0


def _stock_checkpoint(path):
    """A checkpoint written by stock MMEngine in a Python without mmpe."""
    code = (
        "import sys; sys.modules['mmpe'] = None\n"
        'import numpy as np\n'
        'from mmengine.logging import HistoryBuffer, MessageHub\n'
        'from mmengine.runner.checkpoint import save_checkpoint\n'
        "hub = MessageHub.get_instance('stock')\n"
        'for v in (0.5, 1.5, 2.5):\n'
        "    hub.update_scalar('train/loss', v, count=2)\n"
        "hub.update_scalar('train/lr', np.float64(0.01))\n"
        "hub.update_info('eta', np.float64(12.5))\n"
        'save_checkpoint(dict(meta=dict(epoch=1), '
        'message_hub=hub.state_dict(), np_scalar=np.float32(1.5)), '
        f'{path!r})\n')
    subprocess.run([sys.executable, '-c', code], check=True, cwd='/')


def test_stock_mmengine_checkpoint_loads_through_narrow_allow_list(tmp_path):
    path = str(tmp_path / 'stock.pth')
    _stock_checkpoint(path)
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    assert 'builtins.getattr' in unsafe
    assert 'mmengine.logging.history_buffer.HistoryBuffer' in unsafe
    with pytest.raises(pickle.UnpicklingError):  # stock torch refuses it
        torch.load(path, weights_only=True)
    before = dict(HistoryBuffer._statistics_methods)
    allow_list = set(torch.serialization.get_safe_globals())

    ckpt = load_from_local_safe(path)
    want_hub = MessageHub.get_instance('test_stock_want')  # same updates
    for v in (0.5, 1.5, 2.5):
        want_hub.update_scalar('train/loss', v, count=2)
    want = want_hub.get_scalar('train/loss')
    _assert_same_buffer(ckpt['message_hub']['log_scalars']['train/loss'],
                        want)
    assert ckpt['message_hub']['log_scalars']['train/lr'].current() == 0.01
    eta = ckpt['message_hub']['runtime_info']['eta']
    assert type(eta) is np.float64 and eta == 12.5
    assert type(ckpt['np_scalar']) is np.float32 and ckpt['np_scalar'] == 1.5
    # the allow-list was scoped to the call, the class registry untouched
    assert set(torch.serialization.get_safe_globals()) == allow_list
    assert HistoryBuffer._statistics_methods == before
    hub = MessageHub.get_instance('test_stock_loaded')
    hub.load_state_dict(ckpt['message_hub'])
    assert hub.get_scalar('train/loss').mean() == want.mean()


def test_old_mmpe_checkpoint_loads(tmp_path):
    """mmpe <= 0.1 stored buffers as rebuild_history_buffer(log, count, n)."""
    buf = _filled_buffer()
    path = str(tmp_path / 'old_mmpe.pth')

    def old_reducer(b):
        return rebuild_history_buffer, (torch.from_numpy(b.data[0]),
                                        torch.from_numpy(b.data[1]),
                                        int(b.max_length))

    _save_with(
        dict(message_hub=dict(log_scalars={'train/loss': buf})), path,
        _for_buffers(old_reducer))
    assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == [
        'mmpe.engine.safe_checkpoint.rebuild_history_buffer'
    ]
    ckpt = load_from_local_safe(path)
    _assert_same_buffer(ckpt['message_hub']['log_scalars']['train/loss'], buf)


def test_crafted_statistics_methods_do_not_reach_the_class(tmp_path):
    """A stock-looking buffer whose pickled methods are other allowed
    callables loads, and HistoryBuffer's registry keeps its own methods."""
    path = str(tmp_path / 'crafted.pth')

    def crafted(b):
        import copyreg
        state = dict(vars(b), statistics_methods={'mean': np.ndarray})
        return copyreg.__newobj__, (HistoryBuffer, ), state

    _save_with(dict(b=_filled_buffer()), path, _for_buffers(crafted))
    before = dict(HistoryBuffer._statistics_methods)
    ckpt = load_from_local_safe(path)
    assert HistoryBuffer._statistics_methods == before
    assert ckpt['b'].statistics('mean') == _filled_buffer().mean()
    assert 'statistics_methods' not in vars(ckpt['b'])


@pytest.mark.parametrize('name', ['__init__', 'update', 'register_statistics'])
def test_getattr_beyond_statistics_methods_is_refused(tmp_path, name,
                                                      monkeypatch):
    monkeypatch.delenv(UNSAFE_LOAD_ENV, raising=False)
    path = str(tmp_path / 'getattr.pth')
    _save_with(
        dict(f=_RunsCode), path, lambda v: (getattr, (HistoryBuffer, name))
        if v is _RunsCode else NotImplemented)
    with pytest.raises(UnsafeCheckpointError, match=UNSAFE_LOAD_ENV) as err:
        load_from_local_safe(path)
    assert f"getattr('HistoryBuffer', '{name}') refused" in str(err.value)


@pytest.mark.parametrize('payload', [_RunsCode, _RunsShell])
def test_code_executing_checkpoint_is_refused(tmp_path, monkeypatch, payload):
    monkeypatch.delenv(UNSAFE_LOAD_ENV, raising=False)
    sentinel = tmp_path / SENTINEL_NAME
    path = str(tmp_path / 'evil.pth')
    torch.save(dict(state_dict={}, payload=payload(str(sentinel))), path)
    with safe_checkpoint_loading(), \
            pytest.raises(UnsafeCheckpointError) as err:
        _load_checkpoint(path, map_location='cpu')
    assert UNSAFE_LOAD_ENV in str(err.value)
    assert '--allow-unsafe-checkpoint' in str(err.value)
    assert path in str(err.value)
    assert not sentinel.exists(), 'the payload ran during a refused load'
    # It is an UnpicklingError, so callers catching that keep working.
    assert isinstance(err.value, pickle.UnpicklingError)


def test_unsafe_load_needs_explicit_opt_in(tmp_path, monkeypatch):
    sentinel = tmp_path / SENTINEL_NAME
    path = str(tmp_path / 'trusted.pth')
    torch.save(dict(state_dict={}, payload=_RunsCode(str(sentinel))), path)
    monkeypatch.setenv(UNSAFE_LOAD_ENV, '1')
    with safe_checkpoint_loading(), \
            pytest.warns(UserWarning, match=UNSAFE_LOAD_ENV):
        ckpt = _load_checkpoint(path, map_location='cpu')
    assert ckpt['payload'] == str(sentinel)
    assert sentinel.exists()


def test_local_loader_replaced_only_inside_scope():
    stock = CheckpointLoader._get_checkpoint_loader('/some/local.pth')
    assert stock.__name__ == 'load_from_local'
    with safe_checkpoint_loading():
        inside = CheckpointLoader._get_checkpoint_loader('/some/local.pth')
        assert inside is load_from_local_safe
    assert CheckpointLoader._get_checkpoint_loader('/some/local.pth') is stock
    with pytest.raises(RuntimeError), safe_checkpoint_loading():
        raise RuntimeError('training failed')
    assert CheckpointLoader._get_checkpoint_loader('/some/local.pth') is stock


def test_import_mmpe_patches_nothing():
    code = (
        'import copyreg, torch\n'
        'from mmengine.logging import HistoryBuffer\n'
        'from mmengine.runner.checkpoint import CheckpointLoader\n'
        'def state():\n'
        "    return (CheckpointLoader._get_checkpoint_loader('/x.pth'),\n"
        '            sorted(map(repr,\n'
        '                       torch.serialization.get_safe_globals())))\n'
        'before = state()\n'
        'import mmpe\n'
        'assert state() == before, (before, state())\n'
        'assert HistoryBuffer not in copyreg.dispatch_table\n')
    proc = subprocess.run([sys.executable, '-c', code],
                          cwd=ROOT,
                          capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_missing_file_error_names_path(tmp_path):
    missing = str(tmp_path / 'nope.pth')
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        load_from_local_safe(missing)


def test_mmdet_style_released_checkpoint_loads(tmp_path):
    """Released mmdet 3.x checkpoints are meta + state_dict (+ nothing
    exotic); they must keep loading weights-only into a model."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    state = OrderedDict(
        (k, torch.randn_like(v)) for k, v in model.state_dict().items())
    ckpt = dict(
        meta=dict(
            mmdet_version='3.3.0',
            env_info='sys.platform: linux\nPython: 3.8',
            dataset_meta=dict(
                classes=('person', 'car'), palette=[(220, 20, 60)]),
            epoch=150,
            iter=1000,
            config='model = dict(type="DETR")\n'),
        state_dict=state)
    path = str(tmp_path / 'detr_r50.pth')
    torch.save(ckpt, path)
    with safe_checkpoint_loading():
        loaded = load_checkpoint(model, path, map_location='cpu')
    assert loaded['meta']['dataset_meta']['classes'] == ('person', 'car')
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, state[k])


def test_reloads_with_env_var_unset(tmp_path, monkeypatch):
    """The opt-in is read at load time: unsetting it refuses again."""
    monkeypatch.delenv(UNSAFE_LOAD_ENV, raising=False)
    path = str(tmp_path / 'x.pth')
    torch.save(dict(p=_RunsCode(str(tmp_path / 's'))), path)
    assert os.environ.get(UNSAFE_LOAD_ENV) is None
    with safe_checkpoint_loading(), pytest.raises(UnsafeCheckpointError):
        _load_checkpoint(path)
    assert not osp.exists(str(tmp_path / 's'))


def test_unsafe_load_by_argument_not_environment(tmp_path, monkeypatch):
    """``--allow-unsafe-checkpoint`` reaches the loader as an argument: the
    scope's ``allow_unsafe`` (kept by a scope opened inside it, as the
    runner's own scope inside the tool's), or the loader's; the process
    environment is neither read for it nor written."""
    monkeypatch.delenv(UNSAFE_LOAD_ENV, raising=False)
    path = str(tmp_path / 'trusted.pth')
    torch.save(dict(payload=_RunsCode(str(tmp_path / 'ran'))), path)
    with safe_checkpoint_loading(allow_unsafe=True), \
            pytest.warns(UserWarning, match='--allow-unsafe-checkpoint'):
        with safe_checkpoint_loading():  # the runner's scope inside
            ckpt = _load_checkpoint(path, map_location='cpu')
    assert ckpt['payload'] == str(tmp_path / 'ran')
    assert os.environ.get(UNSAFE_LOAD_ENV) is None
    # after the scope, and in a scope without the opt-in: refused again
    for scope in (safe_checkpoint_loading(), safe_checkpoint_loading(False)):
        with scope, pytest.raises(UnsafeCheckpointError):
            _load_checkpoint(path)
    with pytest.warns(UserWarning, match='--allow-unsafe-checkpoint'):
        load_from_local_safe(path, allow_unsafe=True)
    with safe_checkpoint_loading(allow_unsafe=True), \
            pytest.raises(UnsafeCheckpointError):
        load_from_local_safe(path, allow_unsafe=False)  # the call decides


def test_allow_unsafe_must_be_a_bool():
    with pytest.raises(TypeError, match="must be True or False, got 'yes'"):
        with safe_checkpoint_loading(allow_unsafe='yes'):
            pass
