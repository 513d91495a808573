"""Engine helpers: a hook that writes plain checkpoints (stock
``torch.load(weights_only=True)`` opens them), scoped weights-only loading
for the tools, a hook that makes resumed runs repeat uninterrupted ones,
bf16 autocast training on CPU; for clusters: atomic checkpoint writes, a
checkpoint and a documented exit status on preemption signals, mid-epoch
resume, and the choice of the newest checkpoint that loads for ``--resume``.
``BackbonePaddingMaskHook`` is kept only to name its replacement (the
``PaddingAware*`` detectors) when a config uses it. Nothing here acts at
import beyond registering modules (and ``AtomicLocalBackend`` under its own
name in MMEngine's file-backend registry)."""
from .atomic_checkpoint_hook import AtomicCheckpointHook
from .atomic_file_backend import (ATOMIC_BACKEND, AtomicLocalBackend,
                                  atomic_write, is_temporary_name)
from .autocast_optim_wrapper import AutocastOptimWrapper
from .optimizers import ViTLayerDecayOptimWrapperConstructor  # noqa: F401
from .padding_mask_hook import BackbonePaddingMaskHook
from .plain_checkpoint_hook import PlainCheckpointHook
from .plain_param_groups_hook import PlainParamGroupsHook, plain_param_groups
from .plain_state import from_plain, non_plain_paths, to_plain
from .preemption_hook import (PREEMPTED_EXIT_CODE, PreemptionHook,
                              TrainingPreempted)
from .preemption_workers import SignalTolerantWorkerInit, TrainingFlag
from .resumable_loop import ResumableEpochBasedTrainLoop
from .resume_checkpoint import (checkpoint_load_error,
                                find_resumable_checkpoint, resolve_resume,
                                resume_candidates)
from .rng_state_hook import RNGStateHook
from .safe_checkpoint import (UNSAFE_LOAD_ENV, UnsafeCheckpointError,
                              load_from_local_safe, rebuild_history_buffer,
                              safe_checkpoint_loading)

__all__ = [
    'ATOMIC_BACKEND', 'AtomicCheckpointHook', 'AtomicLocalBackend',
    'AutocastOptimWrapper', 'BackbonePaddingMaskHook', 'PREEMPTED_EXIT_CODE',
    'PlainCheckpointHook', 'PlainParamGroupsHook', 'PreemptionHook',
    'RNGStateHook', 'SignalTolerantWorkerInit', 'TrainingFlag',
    'ResumableEpochBasedTrainLoop', 'TrainingPreempted', 'UNSAFE_LOAD_ENV',
    'UnsafeCheckpointError', 'atomic_write', 'checkpoint_load_error',
    'find_resumable_checkpoint', 'from_plain', 'is_temporary_name',
    'load_from_local_safe', 'non_plain_paths', 'plain_param_groups',
    'rebuild_history_buffer',
    'resolve_resume', 'resume_candidates', 'safe_checkpoint_loading', 'to_plain'
]
