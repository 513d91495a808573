"""Weights-only-safe checkpoints for MMEngine 0.10.x on torch >= 2.6.

torch >= 2.6 loads with ``weights_only=True`` by default, and MMEngine 0.10.7
cannot load the checkpoints its own ``Runner`` writes: the message hub stores
:class:`~mmengine.logging.HistoryBuffer` objects whose ``__getstate__`` pickles
references to its statistics methods through ``builtins.getattr``.
Allow-listing ``getattr`` (or loading with ``weights_only=False``) would let a
downloaded checkpoint run arbitrary code, so instead this module:

1. registers a :mod:`copyreg` reducer that stores a ``HistoryBuffer`` as two
   tensors and its maximum length, rebuilt by :func:`rebuild_history_buffer`;
   that function and numpy's array / scalar / dtype constructors (the
   message hub also logs numpy scalars) are all that is added to torch's
   weights-only allow-list;
2. replaces MMEngine's local-file checkpoint loader by one that always loads
   with ``weights_only=True`` and, when a file needs full unpickling, refuses
   it with an error naming the opt-in :data:`UNSAFE_LOAD_ENV`.

Both are installed once by :func:`install` when ``mmpe`` is imported, so
``tools/train.py --resume`` and ``tools/test.py`` work with checkpoints that
mmpe-driven training wrote, and released mmdet checkpoints (``meta`` plus
``state_dict``) keep loading.
"""
import copyreg
import os
import os.path as osp
import pickle
import warnings
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import torch
from mmengine.logging import HistoryBuffer, print_log
from mmengine.runner.checkpoint import CheckpointLoader

#: Set to ``1`` to load a trusted local checkpoint that needs full unpickling.
UNSAFE_LOAD_ENV = 'MMPE_ALLOW_UNSAFE_CHECKPOINT'

_installed = False


def rebuild_history_buffer(log_history: torch.Tensor,
                           count_history: torch.Tensor,
                           max_length: int) -> HistoryBuffer:
    """Rebuild a :class:`HistoryBuffer` saved by :func:`_reduce_history_buffer`.

    Args:
        log_history (Tensor): Logged values, shape (N,).
        count_history (Tensor): Counts of the logged values, shape (N,).
        max_length (int): Maximum length of the buffer.

    Returns:
        HistoryBuffer: The buffer, its histories as numpy arrays again.
    """
    if not (isinstance(log_history, torch.Tensor)
            and isinstance(count_history, torch.Tensor)
            and isinstance(max_length, int)):
        raise TypeError('rebuild_history_buffer expects (Tensor, Tensor, int), '
                        f'got ({type(log_history).__name__}, '
                        f'{type(count_history).__name__}, '
                        f'{type(max_length).__name__})')
    buffer = HistoryBuffer(max_length=max_length)
    # Assign directly: the constructor would re-wrap and may warn on length.
    buffer._log_history = log_history.numpy().copy()
    buffer._count_history = count_history.numpy().copy()
    return buffer


def _numpy_safe_globals() -> List[Any]:
    """numpy's array, scalar and dtype constructors.

    They rebuild numeric data from bytes; an object-dtype payload would still
    have to pass the allow-list on its own.
    """
    from numpy.core import multiarray
    safe: List[Any] = [
        multiarray.scalar, multiarray._reconstruct, np.ndarray, np.dtype
    ]
    dtypes = getattr(np, 'dtypes', None)  # numpy >= 1.25: one class a dtype
    if dtypes is not None:
        safe += [
            getattr(dtypes, name) for name in dir(dtypes)
            if name.endswith('DType') and name not in ('ObjectDType',
                                                       'VoidDType')
        ]
    return safe


def _reduce_history_buffer(
        buffer: HistoryBuffer) -> Tuple[Callable, Tuple[Any, ...]]:
    # Only numeric arrays go in: statistics methods are class-level and get
    # registered again by the code that defines them.
    log = torch.from_numpy(np.ascontiguousarray(buffer._log_history))
    count = torch.from_numpy(np.ascontiguousarray(buffer._count_history))
    return rebuild_history_buffer, (log, count, int(buffer.max_length))


class UnsafeCheckpointError(pickle.UnpicklingError):
    """Raised when a checkpoint cannot be loaded with ``weights_only=True``."""


def load_from_local_safe(filename: str,
                         map_location: Optional[Any] = None) -> Any:
    """Load a local checkpoint with ``torch.load(weights_only=True)``.

    Args:
        filename (str): Path of the checkpoint.
        map_location (optional): Same as :func:`torch.load`.

    Returns:
        dict: The loaded checkpoint.

    Raises:
        FileNotFoundError: If ``filename`` is not a file.
        UnsafeCheckpointError: If the file needs objects outside torch's
            weights-only allow-list and :data:`UNSAFE_LOAD_ENV` is not ``1``.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'Checkpoint {filename!r} can not be found.')
    try:
        return torch.load(
            filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        reason = next((ln for ln in lines if 'Unsupported global' in ln),
                      lines[-1] if lines else repr(err))
        if os.environ.get(UNSAFE_LOAD_ENV) == '1':
            warnings.warn(
                f'Loading {filename!r} with full unpickling because '
                f'{UNSAFE_LOAD_ENV}=1: this can run code stored in the file.')
            return torch.load(
                filename, map_location=map_location, weights_only=False)
        raise UnsafeCheckpointError(
            f'Checkpoint {filename!r} cannot be loaded weights-only: it '
            f'stores objects outside torch\'s allow-list ({reason}). '
            f'Checkpoints written by mmpe-driven '
            f'training load safely; to load this one anyway, and only if you '
            f'trust where it came from, set the environment variable '
            f'{UNSAFE_LOAD_ENV}=1 (or pass --allow-unsafe-checkpoint to '
            f'tools/train.py or tools/test.py).') from err


def install() -> None:
    """Install the reducer, the allow-list entry and the safe local loader.

    Idempotent; called when ``mmpe`` is imported.
    """
    global _installed
    if _installed:
        return
    if not hasattr(torch.serialization, 'add_safe_globals'):
        warnings.warn(
            f'torch {torch.__version__} has no weights-only allow-list '
            '(added in torch 2.4): checkpoints load with MMEngine\'s default '
            'loader. Upgrade torch for safe loading.')
        _installed = True
        return
    copyreg.pickle(HistoryBuffer, _reduce_history_buffer)
    torch.serialization.add_safe_globals([rebuild_history_buffer] +
                                         _numpy_safe_globals())
    CheckpointLoader.register_scheme(
        prefixes='', loader=load_from_local_safe, force=True)
    print_log(
        'mmpe: checkpoints load weights-only', logger='current', level=10)
    _installed = True
