"""Results of reading each file, kept between runs, keyed by (path, size,
modification time).

A second start of a run (a requeued job, another experiment on the same
data) reads again only the files that changed. The cache lives in the
user's cache directory (``$XDG_CACHE_HOME/mmpe/dataset_check``, else
``~/.cache/mmpe/dataset_check``), one JSON file per data set named after its
annotation file or image folder and a hash of its absolute path, because:

* it never writes into the data set's folder (often read-only or shared
  between users) nor next to the user's files;
* it outlives a work dir, so every run on the same data set shares it;
* a file's entry holds only what the check derived from it (decoded size,
  label values, or why it cannot be read), tied to the file's size and
  modification time and to how it was read (``ImageReadSettings.key``); a
  changed or repaired file is read again.

The file is replaced atomically (``mmpe.utils.atomic_write``), so runs
started together never read a partial cache; the last one's results win.
A cache that cannot be read or written is ignored with a warning.
"""
import hashlib
import json
import os
import os.path as osp
from typing import Dict, Optional, Tuple

from ...utils.atomic_files import atomic_write

#: Bumped when the meaning of a cached result changes.
CACHE_VERSION = 2


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/mmpe/dataset_check`` or
    ``~/.cache/mmpe/dataset_check``."""
    root = os.environ.get('XDG_CACHE_HOME') or osp.join(
        osp.expanduser('~'), '.cache')
    return osp.join(root, 'mmpe', 'dataset_check')


def file_stamp(path: str) -> Optional[Tuple[int, int]]:
    """(size, modification time in ns) of a local file, None if there is
    no such local file (remote paths are never cached)."""
    if '://' in path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class FileCheckCache:
    """Per-file results of one data set, loaded from and saved to one file.

    Args:
        cache_dir (str | None): Directory of the cache files; None keeps
            nothing.
        source (str): What identifies the data set (its annotation file or
            image folder); names the cache file.
    """

    def __init__(self, cache_dir: Optional[str], source: str):
        self.path = None
        self.entries: Dict[str, list] = {}
        self.warning: Optional[str] = None
        self.sections: Dict[str, object] = {}
        if not cache_dir:
            return
        source = osp.abspath(source)
        digest = hashlib.sha1(source.encode()).hexdigest()[:12]
        name = osp.basename(source.rstrip('/')) or 'data'
        self.path = osp.join(osp.expanduser(cache_dir), f'{name}-{digest}.json')
        if not osp.isfile(self.path):
            return
        try:
            with open(self.path) as f:
                data = json.load(f)
            if data.get('version') == CACHE_VERSION and \
                    data.get('source') == source:
                self.entries = data.get('files', {})
                self.sections = data.get('sections', {})
        except (OSError, ValueError) as err:
            self.warning = f'dataset check cache {self.path} unreadable ' \
                f'({err}); checking every file'

    def get(self, path: str, key: str) -> Optional[dict]:
        """The cached result of ``path`` read with ``key``, if the file is
        unchanged since."""
        entry = self.entries.get(osp.abspath(path))
        stamp = file_stamp(path)
        if entry is None or stamp is None:
            return None
        size, mtime, entry_key, result = entry
        if (size, mtime) != stamp or entry_key != key:
            return None
        return result

    def put(self, path: str, key: str, result: dict) -> None:
        stamp = file_stamp(path)
        if stamp is not None:
            self.entries[osp.abspath(path)] = [*stamp, key, result]

    def section(self, name: str, stamp: list) -> Optional[object]:
        """A cached value of the whole data set (e.g. the annotation file's
        problems), if ``stamp`` is the one it was stored with."""
        entry = self.sections.get(name)
        if entry is None or entry[0] != stamp:
            return None
        return entry[1]

    def put_section(self, name: str, stamp: list, value: object) -> None:
        self.sections[name] = [stamp, value]

    def save(self, source: str) -> Optional[str]:
        """Write the cache; returns a warning instead of raising."""
        if self.path is None:
            return None
        data = dict(version=CACHE_VERSION, source=osp.abspath(source),
                    files=self.entries, sections=self.sections)
        try:
            atomic_write(json.dumps(data), self.path)
        except OSError as err:
            return f'dataset check cache {self.path} not written ({err})'
        return None
