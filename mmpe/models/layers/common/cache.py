"""The one bounded cache of mmpe: tables derived from a grid size.

Bucket-id plans, per-axis index tables and position tables depend on the
token grid, which changes with every batch of a detector. Each is kept in a
:class:`BoundedCache` (least recently used out), keyed by everything it
depends on, so a stream of sizes neither rebuilds every step nor grows.

While a graph is traced (:func:`~.tracing.is_tracing`) the
cache is bypassed: the grid may be symbolic, and the tables become tensor
ops of the graph, computed from the grid, instead of constants frozen at one
size.
"""
import threading
from collections import OrderedDict
from typing import Callable, Hashable, NamedTuple

from ....utils.arg_checks import check_int
from .tracing import is_tracing


class CacheInfo(NamedTuple):
    """Hit / miss counters and size of a :class:`BoundedCache`."""
    hits: int
    misses: int
    size: int
    maxsize: int


class BoundedCache:
    """A thread-safe least-recently-used dict with at most ``max_size``
    entries and hit / miss counters.

    The lock serves ``nn.DataParallel`` replicas and data-loader threads,
    which may look up the same grid at once.

    Args:
        max_size (int): Maximum number of entries kept. Defaults to 16.
    """

    def __init__(self, max_size: int = 16) -> None:
        check_int('cache_size', max_size)
        self.max_size = max_size
        self._data: 'OrderedDict[Hashable, object]' = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: Hashable, build: Callable[[], object]) -> object:
        """Return the entry for ``key``, building and storing it if absent.

        While tracing, return ``build()`` and leave the cache untouched.
        """
        if is_tracing():
            return build()
        with self._lock:
            if key in self._data:
                self.hits += 1
                self._data.move_to_end(key)
                return self._data[key]
            self.misses += 1
            value = build()
            self._data[key] = value
            if len(self._data) > self.max_size:
                self._data.popitem(last=False)
            return value

    def info(self) -> CacheInfo:
        """Counters since the last :meth:`clear`."""
        with self._lock:
            return CacheInfo(self.hits, self.misses, len(self._data),
                             self.max_size)

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)
