"""Choose the checkpoint ``--resume`` continues from, skipping bad ones.

MMEngine's auto-resume reads the ``last_checkpoint`` pointer and loads the
file it names; a truncated or otherwise unreadable file there (a job killed
while an earlier MMEngine wrote it, a full disk, a partial copy) stops the
run with torch's error, although an older checkpoint beside it would do.
:class:`~mmpe.engine.MMPERunner` resolves the resume point in
``load_or_resume``, before the Runner loads anything:

* :func:`find_resumable_checkpoint` (``--resume`` without a path) lists the
  file named by ``last_checkpoint``, then every other ``*.pth`` in the
  checkpoint directories except ``best_*.pth`` (those lack the optimizer
  state) newest first by modification time, and loads them in that order
  (weights-only, on CPU, with :func:`~mmpe.engine.load_from_local_safe`,
  the loader the Runner then uses) until one loads. Each file that does not
  load is named in a warning with the reason, and renamed to
  ``<name>.unloadable`` (``.unloadable.1``, ... if taken) so that the
  resumed run, which writes the same file names again, does not overwrite
  it; nothing is deleted.
* :func:`checkpoint_load_error` (``--resume PATH``) gives the reason an
  explicit checkpoint does not load, so the tool stops naming path and
  reason.

A checkpoint that needs full unpickling is not "bad": its
:class:`~mmpe.engine.UnsafeCheckpointError` is raised, with the way to opt
in, instead of skipping it.
"""
import glob
import os
import os.path as osp
from typing import List, Optional, Tuple

from .safe_checkpoint import UnsafeCheckpointError, load_from_local_safe

POINTER = 'last_checkpoint'
SET_ASIDE_SUFFIX = '.unloadable'


def checkpoint_load_error(path: str) -> Optional[str]:
    """Why ``path`` cannot be resumed from, or None if it loads.

    Args:
        path (str): A local checkpoint path.

    Returns:
        str | None: The reason (the loader's error message, one line).

    Raises:
        UnsafeCheckpointError: If the file is readable but needs full
            unpickling (see :mod:`mmpe.engine.safe_checkpoint`).
    """
    try:
        checkpoint = load_from_local_safe(path, map_location='cpu')
    except UnsafeCheckpointError:
        raise
    except Exception as err:  # noqa: BLE001  (any failure makes it unusable)
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        return f'{type(err).__name__}: {lines[0] if lines else err!r}'
    if not isinstance(checkpoint, dict) or 'state_dict' not in checkpoint \
            or 'meta' not in checkpoint:
        return ('not a training checkpoint (no `state_dict` and `meta` '
                'entries)')
    return None


def _read_pointer(work_dir: str) -> Optional[str]:
    path = osp.join(work_dir, POINTER)
    if not osp.isfile(path):
        return None
    with open(path) as f:
        target = f.read().strip()
    return target or None


def _is_main_process() -> bool:
    """Rank 0 (or no launcher) from the launchers' environment variables;
    the process group does not exist yet when the resume point is chosen."""
    for var in ('RANK', 'SLURM_PROCID', 'OMPI_COMM_WORLD_RANK'):
        if var in os.environ:
            return int(os.environ[var]) == 0
    return True


def resume_candidates(work_dir: str,
                      ckpt_dirs: Tuple[str, ...] = ()) -> List[str]:
    """Checkpoints that auto-resume may use, newest first.

    Args:
        work_dir (str): The run's work dir (holds ``last_checkpoint``).
        ckpt_dirs (tuple[str]): Further local directories with checkpoints
            (a ``CheckpointHook.out_dir``).

    Returns:
        list[str]: The pointer's target (if it names an existing file)
        first, then every other ``*.pth`` but ``best_*.pth`` by modification
        time, newest first.
    """
    paths = []
    pointer = _read_pointer(work_dir)
    if pointer is not None:
        paths.append(pointer)
    for d in (work_dir, *ckpt_dirs):
        paths += [
            p for p in sorted(glob.glob(osp.join(d, '*.pth')))
            if not osp.basename(p).startswith('best_')
        ]
    found = {}  # (device, inode) -> (path, mtime, order): each file once
    for i, path in enumerate(paths):
        try:  # another rank may be renaming a bad file aside right now
            st = os.stat(path)
        except OSError:
            continue
        if osp.isfile(path):
            found.setdefault((st.st_dev, st.st_ino), (path, st.st_mtime_ns, i))
    # the pointer's file first: CheckpointHook moves it to each new regular
    # checkpoint, never to best_* or published copies
    ranked = sorted(
        found.values(), key=lambda f: (f[0] != pointer, -f[1], f[2]))
    return [path for path, _, _ in ranked]


def _set_aside(path: str) -> str:
    target = path + SET_ASIDE_SUFFIX
    n = 0
    while osp.exists(target):
        n += 1
        target = f'{path}{SET_ASIDE_SUFFIX}.{n}'
    os.rename(path, target)
    return target


def find_resumable_checkpoint(
        work_dir: str,
        ckpt_dirs: Tuple[str, ...] = ()) -> Tuple[Optional[str], List[str]]:
    """The newest checkpoint in ``work_dir`` that loads.

    Newer files that do not load are renamed aside (only by the main
    process) once a loadable one is found.

    Args:
        work_dir (str): The run's work dir.
        ckpt_dirs (tuple[str]): Further local checkpoint directories.

    Returns:
        tuple[str | None, list[str]]: The checkpoint to resume from (None if
        there is none at all) and one warning per skipped file, naming it,
        the reason and where it was kept.

    Raises:
        RuntimeError: If there are checkpoints and none of them loads
            (nothing is renamed then).
        UnsafeCheckpointError: If the newest loadable one needs full
            unpickling.
    """
    notes = []
    pointer = _read_pointer(work_dir)
    if pointer is not None and not osp.isfile(pointer):
        notes.append(f'{osp.join(work_dir, POINTER)} names {pointer!r}, '
                     'which does not exist')
    candidates = resume_candidates(work_dir, ckpt_dirs)
    bad = []
    for path in candidates:
        reason = checkpoint_load_error(path)
        if reason is None:
            main = _is_main_process()
            for bad_path, bad_reason in bad:
                msg = f'skipped {bad_path}: it does not load ({bad_reason})'
                if main:
                    msg += (f'; kept as {_set_aside(bad_path)}, so that the '
                            'resumed run does not overwrite it')
                notes.append(msg)
            return path, notes
        bad.append((path, reason))
    if candidates:
        raise RuntimeError(
            f'no checkpoint in {work_dir!r} loads:\n  ' + '\n  '.join(
                f'{p}: {r}' for p, r in bad) +
            '\nResume from a checkpoint elsewhere with --resume PATH, or '
            'start afresh with another --work-dir (the files are kept).')
    return None, notes


def checkpoint_dirs(cfg) -> Tuple[str, ...]:
    """Local checkpoint directories of ``cfg`` besides its work dir: where
    ``default_hooks.checkpoint.out_dir`` puts them (``out_dir/<work dir
    name>``, as ``CheckpointHook`` does); remote ones are left to MMEngine.

    Args:
        cfg (Config): The full config (``work_dir`` set).
    """
    hook = (cfg.get('default_hooks') or {}).get('checkpoint') or {}
    out_dir = hook.get('out_dir') if isinstance(hook, dict) else None
    if not out_dir or '://' in str(out_dir):
        return ()
    return (osp.join(out_dir, osp.basename(cfg.work_dir.rstrip('/'))), )
