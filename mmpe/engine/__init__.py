"""Engine helpers: a hook that writes plain checkpoints (stock
``torch.load(weights_only=True)`` opens them), scoped weights-only loading
for the tools, a hook that makes resumed runs repeat uninterrupted ones,
bf16 autocast training on CPU. ``BackbonePaddingMaskHook`` is kept only to
name its replacement (the ``PaddingAware*`` detectors) when a config uses it.
Nothing here acts at import."""
from .autocast_optim_wrapper import AutocastOptimWrapper
from .padding_mask_hook import BackbonePaddingMaskHook
from .plain_checkpoint_hook import PlainCheckpointHook
from .plain_state import from_plain, non_plain_paths, to_plain
from .rng_state_hook import RNGStateHook
from .safe_checkpoint import (UNSAFE_LOAD_ENV, UnsafeCheckpointError,
                              load_from_local_safe, rebuild_history_buffer,
                              safe_checkpoint_loading)

__all__ = [
    'AutocastOptimWrapper', 'BackbonePaddingMaskHook', 'PlainCheckpointHook',
    'RNGStateHook', 'UNSAFE_LOAD_ENV', 'UnsafeCheckpointError', 'from_plain',
    'load_from_local_safe', 'non_plain_paths', 'rebuild_history_buffer',
    'safe_checkpoint_loading', 'to_plain'
]
