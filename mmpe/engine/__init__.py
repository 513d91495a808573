"""Engine helpers: weights-only-safe checkpoints for MMEngine on torch >= 2.6."""
from .safe_checkpoint import (UNSAFE_LOAD_ENV, UnsafeCheckpointError,
                              install, load_from_local_safe,
                              rebuild_history_buffer)

install()

__all__ = [
    'UNSAFE_LOAD_ENV', 'UnsafeCheckpointError', 'install',
    'load_from_local_safe', 'rebuild_history_buffer'
]
