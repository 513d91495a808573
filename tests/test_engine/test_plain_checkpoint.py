"""Plain checkpoint contents (mmpe.engine.plain_state) and the hook that
applies them (PlainCheckpointHook): stock torch.load(weights_only=True)
opens the result, and decoding gives back equal objects."""
import contextlib
import random
from collections import OrderedDict

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub

from mmpe.engine import (PlainCheckpointHook, RNGStateHook, from_plain,
                         non_plain_paths, to_plain)
from mmpe.engine.plain_state import PLAIN_TYPE_KEY

# numpy dtypes a checkpoint may hold: torch has most of them, the rest
# (float128 aside) go through raw bytes; '>f4' is byte-swapped.
DTYPES = [
    'float16', 'float32', 'float64', 'int8', 'int16', 'int32', 'int64',
    'uint8', 'uint16', 'uint32', 'uint64', 'bool', 'complex64', '>f4', '>i8',
    'datetime64[s]', 'U3'
]


def _plain_only(obj):
    """Every leaf a tensor / bool / int / float / str / None and every
    container a list / tuple / dict / OrderedDict (written for the test,
    independent of non_plain_paths)."""
    if isinstance(obj, torch.Tensor) or type(obj) in (bool, int, float, str,
                                                      type(None)):
        return True
    if type(obj) in (dict, OrderedDict):
        return all(type(k) in (str, int) and _plain_only(v)
                   for k, v in obj.items())
    if type(obj) in (list, tuple):
        return all(_plain_only(v) for v in obj)
    return False


def _weights_only_round_trip(obj, tmp_path):
    path = str(tmp_path / 'plain.pth')
    torch.save(obj, path)
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('shape', [(), (0, ), (5, ), (2, 3)])
def test_numpy_arrays_and_scalars_round_trip(dtype, shape, tmp_path):
    raw = np.random.default_rng(0).integers(0, 100, size=shape)
    array = raw.astype(str).astype(dtype) if dtype == 'U3' else \
        raw.astype(dtype)
    scalar = array.reshape(-1)[0] if array.size else \
        np.zeros((), dtype)[()]
    assert isinstance(scalar, np.generic)
    plain = to_plain(dict(a=array, s=scalar))
    assert _plain_only(plain) and non_plain_paths(plain) == []
    back = from_plain(_weights_only_round_trip(plain, tmp_path))
    assert type(back['a']) is np.ndarray
    assert back['a'].dtype == np.dtype(dtype) and back['a'].shape == shape
    np.testing.assert_array_equal(back['a'], array)
    assert type(back['s']) is type(scalar) and back['s'] == scalar


def test_numpy_float64_is_not_taken_for_a_float(tmp_path):
    """np.float64 subclasses float but pickles as a numpy global."""
    value = np.float64(0.1)
    plain = to_plain([value])
    assert type(plain[0]) is dict and plain[0][PLAIN_TYPE_KEY] == \
        'numpy.scalar'
    back = from_plain(_weights_only_round_trip(plain, tmp_path))
    assert type(back[0]) is np.float64 and back[0] == value


def test_history_buffer_round_trip(tmp_path):
    buf = HistoryBuffer(max_length=3)
    for v, c in [(1.0, 1), (2.5, 4), (np.float64(3.25), 2), (7, 1)]:
        buf.update(v, count=c)  # the first entry drops out: max_length 3
    plain = to_plain(buf)
    assert _plain_only(plain)
    back = from_plain(_weights_only_round_trip(plain, tmp_path))
    assert type(back) is HistoryBuffer and back.max_length == 3
    for got, want in zip(back.data, buf.data):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype
    for method in ('mean', 'min', 'max', 'current'):
        assert back.statistics(method) == buf.statistics(method)
    back.update(1.0)  # still a working buffer
    assert back.current() == 1.0 and len(back.data[0]) == 3


def test_containers_kept_and_state_dict_metadata_survives():
    state = torch.nn.BatchNorm1d(3).state_dict()
    meta = dict(epoch=2, classes=('a', 'b'), arr=np.arange(3))
    ckpt = dict(state_dict=state, meta=meta, steps=[np.int64(4), 5])
    plain = to_plain(ckpt)
    # nothing to change in a state_dict: the very object comes back
    assert plain['state_dict'] is state
    assert plain['meta']['classes'] == ('a', 'b')
    assert plain['steps'][1] == 5 and type(plain['steps']) is list
    changed_state = OrderedDict(state, x=np.float32(1.0))
    changed_state._metadata = state._metadata
    converted = to_plain(changed_state)
    assert type(converted) is OrderedDict and converted is not changed_state
    assert converted._metadata == state._metadata
    assert converted['x'][PLAIN_TYPE_KEY] == 'numpy.scalar'


def test_non_plain_paths_names_what_is_left():

    class Custom:
        pass

    left = non_plain_paths(
        dict(a=[1, Custom()], b=dict(c=np.zeros(2, dtype=object))))
    assert left == [
        f'a[1] ({__name__}.{Custom.__qualname__})',
        'b.c (numpy.ndarray)'
    ]


def test_unknown_plain_type_raises_naming_choices():
    with pytest.raises(ValueError, match="'Frobnicator'.*'numpy.ndarray'"):
        from_plain({PLAIN_TYPE_KEY: 'Frobnicator'})


@contextlib.contextmanager
def _global_generators_restored():
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])


def test_hook_makes_runner_checkpoint_plain_and_restores_it(tmp_path):
    # the hook saves and restores the global generators, so the test uses
    # them; it gives them back as it found them
    with _global_generators_restored():
        hub = MessageHub.get_instance('test_plain_hook')
        for step in range(4):
            hub.update_scalar('train/loss', 1.0 / (step + 1))
        hub.update_scalar('train/lr', np.float64(0.01))
        hub.update_info('eta', np.float64(12.5))
        hub.update_info('iter', 4)
        checkpoint = dict(
            meta=dict(epoch=1, iter=4),
            state_dict=OrderedDict(w=torch.randn(2)),
            message_hub=hub.state_dict())
        random.seed(1)
        np.random.seed(1)
        torch.manual_seed(1)
        hooks = sorted([PlainCheckpointHook(), RNGStateHook()],
                       key=lambda h: ['VERY_LOW', 'LOWEST'].index(h.priority))
        for hook in hooks:  # the Runner's order: by priority
            hook.before_save_checkpoint(None, checkpoint)
        want_draws = (random.random(), np.random.rand(), torch.rand(1))

        loaded = _weights_only_round_trip(checkpoint, tmp_path)
        assert _plain_only(loaded)
        for hook in hooks:
            hook.after_load_checkpoint(None, loaded)
        new_hub = MessageHub.get_instance('test_plain_hook_loaded')
        new_hub.load_state_dict(loaded['message_hub'])
        for key in ('train/loss', 'train/lr'):
            got, want = new_hub.get_scalar(key), hub.get_scalar(key)
            assert type(got) is HistoryBuffer
            for g, w in zip(got.data, want.data):
                np.testing.assert_array_equal(g, w)
                assert g.dtype == w.dtype
        eta = new_hub.get_info('eta')
        assert type(eta) is np.float64 and eta == 12.5
        assert new_hub.get_info('iter') == 4
        # RNGStateHook restored the generators: the same draws follow
        assert (random.random(), np.random.rand()) == want_draws[:2]
        assert torch.equal(torch.rand(1), want_draws[2])
