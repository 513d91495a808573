"""File writes that appear under their final name only when complete.

A plain ``open(path, 'wb')`` leaves a truncated file under ``path`` when the
process is killed during the write (a preempted cluster job, an out-of-memory
kill); for a checkpoint, ``torch.load`` then fails with "failed finding
central directory". :func:`atomic_write` writes to a hidden temporary file in
the same directory, flushes and fsyncs it, and renames it over the final name
with :func:`os.replace` (atomic on POSIX file systems), then fsyncs the
directory so that the rename itself survives a crash of the machine. A kill
at any moment leaves either the previous file or the new one under the final
name, and at worst a temporary file (:func:`is_temporary_name`) beside it.

Used by the checkpoint file backend (``mmpe.engine.AtomicLocalBackend``) and
the data set check's cache (``mmpe.datasets.data_check.file_cache``).
"""
import os
import os.path as osp
import re
from pathlib import Path
from typing import Union

_TEMP_SUFFIX = '.mmpe-tmp'
_TEMP_PATTERN = re.compile(r'^\..+\.(\d+)' + re.escape(_TEMP_SUFFIX) + r'$')


def temporary_name(path: str) -> str:
    """The temporary path :func:`atomic_write` writes before renaming.

    Hidden (a leading dot, so ``*.pth`` globs skip it), in the same
    directory as ``path`` (so the rename does not cross file systems), and
    tagged with the writing process id.
    """
    head, tail = osp.split(path)
    return osp.join(head, f'.{tail}.{os.getpid()}{_TEMP_SUFFIX}')


def is_temporary_name(name: str) -> bool:
    """Whether a file name is one of :func:`temporary_name`'s."""
    return _TEMP_PATTERN.match(osp.basename(name)) is not None


def _fsync_dir(dirname: str) -> None:
    try:
        fd = os.open(dirname or '.', os.O_RDONLY)
    except OSError:  # e.g. platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(data: Union[bytes, str],
                 path: Union[str, Path],
                 encoding: str = 'utf-8') -> None:
    """Write ``data`` to ``path`` so that ``path`` is never partly written.

    Args:
        data (bytes | str): The whole content; ``str`` is encoded with
            ``encoding``.
        path (str | Path): The final path; its directory is created.
        encoding (str): Encoding of ``str`` data.
    """
    path = str(path)
    if isinstance(data, str):
        data = data.encode(encoding)
    elif not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f'atomic_write expects bytes or str, got '
                        f'{type(data).__name__}')
    dirname = osp.dirname(path)
    if dirname:
        os.makedirs(dirname, exist_ok=True)
    tmp = temporary_name(path)
    try:
        with open(tmp, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # an exception (not a kill): leave no temporary file behind
        if osp.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(dirname)

