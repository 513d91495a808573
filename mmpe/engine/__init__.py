"""Engine helpers: weights-only-safe checkpoints for MMEngine on torch >= 2.6,
a hook that makes resumed runs repeat uninterrupted ones, bf16 autocast
training on CPU, and a hook that hands each batch's padding to a mask-aware
backbone."""
from .autocast_optim_wrapper import AutocastOptimWrapper
from .padding_mask_hook import BackbonePaddingMaskHook
from .rng_state_hook import RNGStateHook
from .safe_checkpoint import (UNSAFE_LOAD_ENV, UnsafeCheckpointError,
                              install, load_from_local_safe,
                              rebuild_history_buffer)

install()

__all__ = [
    'AutocastOptimWrapper', 'BackbonePaddingMaskHook', 'RNGStateHook',
    'UNSAFE_LOAD_ENV', 'UnsafeCheckpointError', 'install',
    'load_from_local_safe', 'rebuild_history_buffer'
]
