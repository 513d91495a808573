"""An MMEngine file backend whose writes are atomic.

MMEngine's ``LocalBackend.put`` opens the final path with ``'wb'`` and writes
into it, so a process killed during the write leaves a truncated file under
that name. :class:`AtomicLocalBackend` writes through
:func:`mmpe.utils.atomic_files.atomic_write` instead (temporary file, fsync,
:func:`os.replace`): the final name holds the previous file or the new one,
never part of one.

The backend is registered in MMEngine's file-backend registry as
:data:`ATOMIC_BACKEND` (a new name: no existing backend changes), and used
where it is asked for by name: :class:`~mmpe.engine.AtomicCheckpointHook`
passes ``backend_args=dict(backend='mmpe_atomic_local')`` to
``Runner.save_checkpoint``.
"""
from pathlib import Path
from typing import Union

from mmengine.fileio import LocalBackend, register_backend

from ..utils.atomic_files import atomic_write

#: Name under which :class:`AtomicLocalBackend` is registered.
ATOMIC_BACKEND = 'mmpe_atomic_local'


@register_backend(ATOMIC_BACKEND)
class AtomicLocalBackend(LocalBackend):
    """MMEngine's local-file backend whose writes are atomic
    (:func:`atomic_write`); reads, listing and removal are LocalBackend's."""

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        atomic_write(obj, filepath)

    def put_text(self,
                 obj: str,
                 filepath: Union[str, Path],
                 encoding: str = 'utf-8') -> None:
        atomic_write(obj, filepath, encoding=encoding)
