"""The converters' refusal of a file that is not their model's.

A converter compares a state dict's keys with the keys its model has and
raises :class:`CheckpointMismatch` with one line naming the keys that are
missing and those of another layout; the tools print that line and exit
with status 2, writing nothing.
"""
from typing import Iterable, List


class CheckpointMismatch(ValueError):
    """A file that is not the converter's model (one-line message)."""


def mismatch_message(source: str, missing: List[str],
                     unexpected: List[str]) -> str:
    """One line naming up to 8 missing and 8 unexpected keys."""
    parts = []
    if missing:
        parts.append(f'missing {len(missing)} keys {missing[:8]}')
    if unexpected:
        parts.append(f'unexpected {len(unexpected)} keys {unexpected[:8]}')
    return f'not a {source} state dict: ' + '; '.join(parts)


def check_keys(source: str, keys: Iterable[str], want: Iterable[str],
               optional: Iterable[str] = ()) -> None:
    """Raise :class:`CheckpointMismatch` unless ``keys`` holds every key of
    ``want`` and nothing outside ``want`` and ``optional``."""
    keys, want = list(keys), list(want)
    allowed = set(want) | set(optional)
    missing = [k for k in want if k not in set(keys)]
    unexpected = [k for k in keys if k not in allowed]
    if missing or unexpected:
        raise CheckpointMismatch(mismatch_message(source, missing,
                                                  unexpected))


def mlp_ratio_of(hidden: int, dims: int) -> float:
    """The ``mlp_ratio`` whose ``int(dims * mlp_ratio)`` (the block's hidden
    width) is ``hidden``."""
    ratio = hidden / dims
    return ratio if int(dims * ratio) == hidden else (hidden + 0.5) / dims
