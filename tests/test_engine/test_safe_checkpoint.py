"""Weights-only-safe checkpoints (mmpe.engine.safe_checkpoint)."""
import os
import os.path as osp
import pickle
from collections import OrderedDict

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner.checkpoint import (CheckpointLoader, _load_checkpoint,
                                        load_checkpoint)

import mmpe  # noqa: F401  (installs the reducer and the loader)
from mmpe.engine import UNSAFE_LOAD_ENV, UnsafeCheckpointError

SENTINEL_NAME = 'code_ran.txt'


class _RunsCode:
    """Unpickling this object writes a file: a stand-in for an exploit."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (_write_file, (self.path, ))


def _write_file(path):
    with open(path, 'w') as f:
        f.write('pwned')
    return path


def test_history_buffer_round_trip_weights_only(tmp_path):
    buf = HistoryBuffer(max_length=5)
    for v in [0.5, 1.5, 2.5]:
        buf.update(v, count=2)
    hub = MessageHub.get_instance('test_safe_ckpt')
    hub.update_scalar('train/loss', 3.0)
    hub.update_info('iter', 7)
    ckpt = dict(
        meta=dict(epoch=1, iter=7, seed=0),
        message_hub=hub.state_dict(),
        buffer=buf,
        state_dict=OrderedDict(w=torch.randn(3)))
    path = str(tmp_path / 'ckpt.pth')
    torch.save(ckpt, path)

    # Plain torch.load with the weights-only default must accept it.
    loaded = torch.load(path, weights_only=True)
    rebuilt = loaded['buffer']
    assert isinstance(rebuilt, HistoryBuffer)
    assert rebuilt.max_length == 5
    np.testing.assert_array_equal(rebuilt.data[0], buf.data[0])
    np.testing.assert_array_equal(rebuilt.data[1], buf.data[1])
    assert rebuilt.data[0].dtype == buf.data[0].dtype
    assert rebuilt.mean() == buf.mean()
    new_hub = MessageHub.get_instance('test_safe_ckpt_loaded')
    new_hub.load_state_dict(loaded['message_hub'])
    assert new_hub.get_scalar('train/loss').current() == 3.0
    assert new_hub.get_info('iter') == 7


def test_history_buffer_deepcopy_still_works():
    import copy
    buf = HistoryBuffer()
    buf.update(1.0)
    copied = copy.deepcopy(buf)
    copied.update(3.0)
    assert buf.current() == 1.0 and copied.mean() == 2.0


def test_code_executing_checkpoint_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(UNSAFE_LOAD_ENV, raising=False)
    sentinel = tmp_path / SENTINEL_NAME
    path = str(tmp_path / 'evil.pth')
    torch.save(dict(state_dict={}, payload=_RunsCode(str(sentinel))), path)
    with pytest.raises(UnsafeCheckpointError) as err:
        _load_checkpoint(path, map_location='cpu')
    assert UNSAFE_LOAD_ENV in str(err.value)
    assert path in str(err.value)
    assert not sentinel.exists(), 'the payload ran during a refused load'
    # It is an UnpicklingError, so callers catching that keep working.
    assert isinstance(err.value, pickle.UnpicklingError)


def test_unsafe_load_needs_explicit_opt_in(tmp_path, monkeypatch):
    sentinel = tmp_path / SENTINEL_NAME
    path = str(tmp_path / 'trusted.pth')
    torch.save(dict(state_dict={}, payload=_RunsCode(str(sentinel))), path)
    monkeypatch.setenv(UNSAFE_LOAD_ENV, '1')
    with pytest.warns(UserWarning, match=UNSAFE_LOAD_ENV):
        ckpt = _load_checkpoint(path, map_location='cpu')
    assert ckpt['payload'] == str(sentinel)
    assert sentinel.exists()


def test_local_loader_is_replaced():
    loader = CheckpointLoader._get_checkpoint_loader('/some/local.pth')
    assert loader.__name__ == 'load_from_local_safe'


def test_missing_file_error_names_path(tmp_path):
    missing = str(tmp_path / 'nope.pth')
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        _load_checkpoint(missing)


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
    with pytest.raises(UnsafeCheckpointError):
        _load_checkpoint(path)
    assert not osp.exists(str(tmp_path / 's'))
