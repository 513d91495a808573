"""Encode checkpoint contents as plain data and decode them back.

A checkpoint is *plain* when it holds only tensors, numbers (``bool``,
``int``, ``float``), strings, ``None``, lists, tuples and dicts
(``OrderedDict`` included): stock ``torch.load(path, weights_only=True)``
opens it in any Python with torch, without mmengine, numpy pickles or mmpe.

MMEngine's Runner puts three kinds of non-plain objects into checkpoints:
:class:`~mmengine.logging.HistoryBuffer` (the message hub's logged scalars),
numpy arrays and numpy scalars. :func:`to_plain` replaces each by a small
dict tagged with :data:`PLAIN_TYPE_KEY`; :func:`from_plain` turns the tagged
dicts back into equal objects (same values, dtype and shape), so a resumed
run sees what the uninterrupted run had.

Tagged forms (``data`` is a tensor of the array's dtype, or of its raw bytes
as ``uint8`` when torch has no such dtype):

* ``{'__plain_type__': 'numpy.ndarray', 'dtype': '<f8', 'shape': [...],
  'data': Tensor}``
* ``{'__plain_type__': 'numpy.scalar', ...}``: the same, for a 0-d array
  whose element is returned;
* ``{'__plain_type__': 'HistoryBuffer', 'max_length': int,
  'log_history': <ndarray form>, 'count_history': <ndarray form>}``.
"""
from collections import OrderedDict
from typing import Any, List

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

#: Key that marks a dict as the plain form of a non-plain object.
PLAIN_TYPE_KEY = '__plain_type__'

# Exact types: numpy's float64 subclasses float but pickles as numpy.
_PLAIN_LEAF_TYPES = (bool, int, float, str, type(None))


def _is_plain_leaf(obj: Any) -> bool:
    return isinstance(obj, torch.Tensor) or type(obj) in _PLAIN_LEAF_TYPES


def history_buffer_from_arrays(log_history: np.ndarray,
                               count_history: np.ndarray,
                               max_length: int) -> HistoryBuffer:
    """A :class:`HistoryBuffer` holding exactly the given histories.

    The constructor would re-wrap the arrays (and may warn on length), so
    they are assigned as they are.
    """
    buffer = HistoryBuffer(max_length=int(max_length))
    buffer._log_history = log_history
    buffer._count_history = count_history
    return buffer


def _encode_array(array: np.ndarray, kind: str) -> dict:
    array = np.array(array, copy=True, order='C')  # keeps 0-d arrays 0-d
    try:
        data = torch.from_numpy(array)
    except (TypeError, ValueError):  # a dtype torch lacks, or byte-swapped
        data = torch.from_numpy(array.reshape(-1).view(np.uint8))
    return {
        PLAIN_TYPE_KEY: kind,
        'dtype': array.dtype.str,
        'shape': list(array.shape),
        'data': data
    }


def _decode_array(plain: dict) -> np.ndarray:
    array = plain['data'].numpy().copy()
    dtype = np.dtype(plain['dtype'])
    if array.dtype != dtype:
        array = array.view(dtype)
    return array.reshape(plain['shape'])


def to_plain(obj: Any) -> Any:
    """``obj`` with every HistoryBuffer and numpy value in tagged plain form.

    Containers are rebuilt only where something inside changed (a
    ``state_dict``'s ``OrderedDict`` keeps its ``_metadata``); lists, tuples
    and dicts of other types come back as ``list``, ``tuple``, ``dict``.
    Object-dtype arrays and other types are returned unchanged (see
    :func:`non_plain_paths`).
    """
    if _is_plain_leaf(obj):
        return obj
    if isinstance(obj, HistoryBuffer):
        log_history, count_history = obj.data
        return {
            PLAIN_TYPE_KEY: 'HistoryBuffer',
            'max_length': int(obj.max_length),
            'log_history': to_plain(log_history),
            'count_history': to_plain(count_history)
        }
    if isinstance(obj, (np.ndarray, np.generic)) and not obj.dtype.hasobject:
        kind = 'numpy.ndarray' if isinstance(obj, np.ndarray) else \
            'numpy.scalar'
        return _encode_array(np.asarray(obj), kind)
    return _map_container(obj, to_plain)


def from_plain(obj: Any) -> Any:
    """Inverse of :func:`to_plain`: tagged dicts become objects again."""
    if isinstance(obj, dict) and PLAIN_TYPE_KEY in obj:
        kind = obj[PLAIN_TYPE_KEY]
        if kind == 'numpy.ndarray':
            return _decode_array(obj)
        if kind == 'numpy.scalar':
            return _decode_array(obj)[()]
        if kind == 'HistoryBuffer':
            return history_buffer_from_arrays(
                from_plain(obj['log_history']),
                from_plain(obj['count_history']), obj['max_length'])
        raise ValueError(f'unknown {PLAIN_TYPE_KEY} {kind!r} in checkpoint; '
                         "valid: 'numpy.ndarray', 'numpy.scalar', "
                         "'HistoryBuffer'")
    return _map_container(obj, from_plain)


def _map_container(obj: Any, fn) -> Any:
    if isinstance(obj, dict):
        items = [(k, fn(v)) for k, v in obj.items()]
        if type(obj) in (dict, OrderedDict) and all(
                new is old for (_, new), old in zip(items, obj.values())):
            return obj
        if isinstance(obj, OrderedDict):
            out = OrderedDict(items)
            out.__dict__.update(vars(obj))  # e.g. state_dict._metadata
            return out
        return dict(items)
    if isinstance(obj, (list, tuple)):
        items = [fn(v) for v in obj]
        if type(obj) in (list, tuple) and all(
                new is old for new, old in zip(items, obj)):
            return obj
        return tuple(items) if isinstance(obj, tuple) else items
    return obj


def non_plain_paths(obj: Any, path: str = '') -> List[str]:
    """Key paths (``'a.b[0]'``) of the values in ``obj`` that are not plain."""
    if _is_plain_leaf(obj):
        return []
    if isinstance(obj, dict) and type(obj) in (dict, OrderedDict):
        bad = [f'{path}.{k}' if path else str(k) for k in obj
               if not isinstance(k, (str, int))]
        for k, v in obj.items():
            bad += non_plain_paths(v, f'{path}.{k}' if path else str(k))
        return bad
    if type(obj) in (list, tuple):
        return [p for i, v in enumerate(obj)
                for p in non_plain_paths(v, f'{path}[{i}]')]
    return [f'{path} ({type(obj).__module__}.{type(obj).__qualname__})']
