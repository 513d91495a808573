"""Weights-only checkpoint loading for mmpe's tools, scoped and opt-in.

torch >= 2.6 loads with ``weights_only=True``: only tensors, plain Python
data and allow-listed globals. Checkpoints written through
``tools/train.py`` are plain (see :mod:`mmpe.engine.plain_checkpoint_hook`)
and open that way with stock torch. Two older kinds are not plain:

* stock MMEngine / MMDetection checkpoints: the message hub's
  :class:`~mmengine.logging.HistoryBuffer` is pickled with numpy arrays and,
  through ``builtins.getattr(HistoryBuffer, 'mean')`` and the like, its
  statistics methods;
* checkpoints written by earlier mmpe versions, whose buffers reference
  :func:`rebuild_history_buffer`.

:func:`load_from_local_safe` still loads them weights-only, with a narrow
allow-list in force only during that call (torch's allow-list is
process-wide: threads loading at that moment see it too). The list
(:func:`legacy_safe_globals`): the ``HistoryBuffer`` class (a stand-in
that ignores the pickled statistics methods), a stand-in for
``builtins.getattr`` that returns nothing but ``HistoryBuffer``'s own
``min`` / ``max`` / ``current`` / ``mean``, :func:`rebuild_history_buffer`,
and numpy's array, scalar and dtype constructors (numeric data from bytes).
Anything else (a pickle that would run code) is refused with
:class:`UnsafeCheckpointError`, unless the caller opts in: the tools'
``--allow-unsafe-checkpoint`` becomes ``safe_checkpoint_loading(
allow_unsafe=True)`` (or ``load_from_local_safe(..., allow_unsafe=True)``),
and a user running other tools (mmdet's, ``mim``) sets
:data:`UNSAFE_LOAD_ENV` ``=1``.

Nothing is installed at import: :class:`~mmpe.engine.MMPERunner` runs
``train`` / ``val`` / ``test``, and ``tools/train.py`` and ``tools/test.py``
run the Runner, inside :func:`safe_checkpoint_loading`, which routes MMEngine's
local-file checkpoint loader to :func:`load_from_local_safe` and restores
MMEngine's own loader on exit::

    with safe_checkpoint_loading():
        runner.train()
"""
import contextlib
import contextvars
import os
import os.path as osp
import pickle
import warnings
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader

from .plain_state import history_buffer_from_arrays

#: Set to ``1`` to load a trusted local checkpoint that needs full unpickling.
UNSAFE_LOAD_ENV = 'MMPE_ALLOW_UNSAFE_CHECKPOINT'

#: What stock ``HistoryBuffer.__getstate__`` pickles through ``getattr``.
HISTORY_BUFFER_STATISTICS = ('min', 'max', 'current', 'mean')

SafeGlobal = Union[Callable, Tuple[Callable, str]]

# the opt-in of the innermost safe_checkpoint_loading(allow_unsafe=...) scope
# (a scope inside an opted-in one keeps the opt-in: the tool that opened the
# outer scope decides, not the runner's own scope within it)
_ALLOW_UNSAFE = contextvars.ContextVar('mmpe_allow_unsafe_checkpoint',
                                       default=False)


class UnsafeCheckpointError(pickle.UnpicklingError):
    """Raised when a checkpoint cannot be loaded with ``weights_only=True``."""


def rebuild_history_buffer(log_history: torch.Tensor,
                           count_history: torch.Tensor,
                           max_length: int) -> HistoryBuffer:
    """Rebuild a :class:`HistoryBuffer` stored by earlier mmpe's reducer.

    Such checkpoints call this function by its import path
    ``mmpe.engine.safe_checkpoint.rebuild_history_buffer``.

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
        raise TypeError('rebuild_history_buffer expects (Tensor, Tensor, '
                        'int), got '
                        f'({type(log_history).__name__}, '
                        f'{type(count_history).__name__}, '
                        f'{type(max_length).__name__})')
    return history_buffer_from_arrays(log_history.numpy().copy(),
                                      count_history.numpy().copy(),
                                      max_length)


class _UnpickledHistoryBuffer(HistoryBuffer):
    """What ``mmengine.logging.history_buffer.HistoryBuffer`` names while a
    stock checkpoint is unpickled weights-only.

    Stock ``HistoryBuffer.__setstate__`` merges the pickled statistics
    methods into the class-wide registry; here they are dropped (the class
    registers its own on construction), so a crafted file cannot replace
    them, and the instance becomes a plain :class:`HistoryBuffer`.
    """

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        state.pop('statistics_methods', None)
        self.__dict__.update(state)
        self.__class__ = HistoryBuffer


def history_buffer_statistic(obj: Any, name: str) -> Callable:
    """``getattr`` narrowed to ``HistoryBuffer``'s statistics methods.

    Stands in for ``builtins.getattr`` while a stock checkpoint is unpickled.

    Raises:
        pickle.UnpicklingError: For any other object or name.
    """
    is_buffer = obj is HistoryBuffer or obj is _UnpickledHistoryBuffer
    if not is_buffer or type(name) is not str \
            or name not in HISTORY_BUFFER_STATISTICS:
        shown = 'HistoryBuffer' if is_buffer else obj
        raise pickle.UnpicklingError(
            f'getattr({shown!r}, {name!r}) refused: weights-only loading '
            f'allows getattr only on HistoryBuffer for '
            f'{HISTORY_BUFFER_STATISTICS}')
    return getattr(HistoryBuffer, name)


def _numpy_safe_globals() -> List[SafeGlobal]:
    """numpy's array, scalar and dtype constructors, under numpy 1 and 2
    names; an object-dtype payload would still need an allow-listed class."""
    from numpy.core import multiarray
    safe: List[SafeGlobal] = [np.ndarray, np.dtype]
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        safe += [(multiarray._reconstruct, f'{module}._reconstruct'),
                 (multiarray.scalar, f'{module}.scalar')]
    dtypes = getattr(np, 'dtypes', None)  # numpy >= 1.25: one class a dtype
    if dtypes is not None:
        safe += [
            getattr(dtypes, name) for name in dir(dtypes)
            if name.endswith('DType') and name not in ('ObjectDType',
                                                       'VoidDType')
        ]
    return safe


def legacy_safe_globals() -> List[SafeGlobal]:
    """The narrow allow-list for stock-MMEngine and old-mmpe checkpoints."""
    return [
        (_UnpickledHistoryBuffer,
         'mmengine.logging.history_buffer.HistoryBuffer'),
        (history_buffer_statistic, 'builtins.getattr'),
        (rebuild_history_buffer,
         'mmpe.engine.safe_checkpoint.rebuild_history_buffer')
    ] + _numpy_safe_globals()


@contextlib.contextmanager
def _scoped_safe_globals(extra: List[SafeGlobal]) -> Iterator[None]:
    scope = getattr(torch.serialization, 'safe_globals', None)
    if scope is None:  # torch < 2.5: plain checkpoints only
        yield
        return
    present = set(torch.serialization.get_safe_globals())
    with scope([g for g in extra if g not in present]):
        yield


def load_from_local_safe(filename: str,
                         map_location: Optional[Any] = None,
                         allow_unsafe: Optional[bool] = None) -> Any:
    """Load a local checkpoint with ``torch.load(weights_only=True)``.

    Plain checkpoints load as they are; stock-MMEngine and old-mmpe ones
    through :func:`legacy_safe_globals`.

    Args:
        filename (str): Path of the checkpoint.
        map_location (optional): Same as :func:`torch.load`.
        allow_unsafe (bool, optional): Load a checkpoint outside the
            allow-list with full unpickling (a trusted file only). None: as
            the enclosing :func:`safe_checkpoint_loading` scope says, or
            :data:`UNSAFE_LOAD_ENV` ``=1``.

    Returns:
        dict: The loaded checkpoint.

    Raises:
        FileNotFoundError: If ``filename`` is not a file.
        UnsafeCheckpointError: If the file needs objects outside that
            allow-list and unsafe loading was not allowed.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'Checkpoint {filename!r} can not be found.')
    try:
        with _scoped_safe_globals(legacy_safe_globals()):
            return torch.load(
                filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        reason = next(
            (ln for ln in lines if 'GLOBAL' in ln or 'refused' in ln),
            lines[-1] if lines else repr(err))
        if allow_unsafe is None:
            allow_unsafe = _ALLOW_UNSAFE.get()
        from_env = os.environ.get(UNSAFE_LOAD_ENV) == '1'
        if allow_unsafe or from_env:
            why = ('--allow-unsafe-checkpoint' if allow_unsafe else
                   f'{UNSAFE_LOAD_ENV}=1')
            warnings.warn(f'Loading {filename!r} with full unpickling '
                          f'because of {why}: this can run code stored in '
                          'the file.')
            return torch.load(
                filename, map_location=map_location, weights_only=False)
        raise UnsafeCheckpointError(
            f'Checkpoint {filename!r} cannot be loaded weights-only: it '
            f'stores objects outside the allow-list ({reason}). Checkpoints '
            'of tools/train.py, stock MMEngine/MMDetection and earlier mmpe '
            'load safely; to load this one anyway, and only if you trust '
            'where it came from, pass --allow-unsafe-checkpoint to '
            'tools/train.py or tools/test.py (other tools: set the '
            f'environment variable {UNSAFE_LOAD_ENV}=1).') from err


@contextlib.contextmanager
def safe_checkpoint_loading(allow_unsafe: bool = False) -> Iterator[None]:
    """Route MMEngine's local-file checkpoint loader to
    :func:`load_from_local_safe` inside the ``with`` block only.

    MMEngine's previous loader is registered again on exit, also when the
    block raises.

    Args:
        allow_unsafe (bool): Inside the block, load checkpoints outside the
            allow-list with full unpickling (``--allow-unsafe-checkpoint``:
            trusted files only). A scope opened inside an allowing one
            allows too (the runner's own scope inside the tool's).
    """
    if not isinstance(allow_unsafe, bool):
        raise TypeError(f'allow_unsafe must be True or False, got '
                        f'{allow_unsafe!r}')
    token = _ALLOW_UNSAFE.set(allow_unsafe or _ALLOW_UNSAFE.get())
    previous = CheckpointLoader._schemes.get('')
    CheckpointLoader.register_scheme(
        prefixes='', loader=load_from_local_safe, force=True)
    try:
        yield
    finally:
        _ALLOW_UNSAFE.reset(token)
        if previous is None:
            CheckpointLoader._schemes.pop('', None)
        else:
            CheckpointLoader.register_scheme(
                prefixes='', loader=previous, force=True)
