"""Engine helpers: a hook that writes plain checkpoints (stock
``torch.load(weights_only=True)`` opens them), scoped weights-only loading
for the tools, a hook that makes resumed runs repeat uninterrupted ones,
bf16 autocast training on CPU; for clusters: atomic checkpoint writes, a
checkpoint and a documented exit status on preemption signals, mid-epoch
resume, and the choice of the newest checkpoint that loads for ``--resume``;
``MMPERunner``, the runner of ``configs/_base_/runtime_mmpe.py``, which
gives these guarantees under any launcher, the exit statuses of a run, and
``DatasetCheckHook``: bad data stops a run before its first step.
For RT-DETR: ``RTDETREMA``, the authors' EMA ramp as an MMEngine averaged
model (for ``EMAHook``), and ``BatchResizeStopHook``, which stops the
batch-level multi-scale from an epoch on.
``BackbonePaddingMaskHook`` is kept only to name its replacement (the
``PaddingAware*`` detectors) when a config uses it. Nothing here acts at
import beyond registering modules (and ``AtomicLocalBackend`` under its own
name in MMEngine's file-backend registry)."""
from .atomic_checkpoint_hook import AtomicCheckpointHook
from .atomic_file_backend import ATOMIC_BACKEND, AtomicLocalBackend
from .autocast_optim_wrapper import AutocastOptimWrapper
from .batch_resize_stop_hook import BatchResizeStopHook
from .dataset_check_hook import DatasetCheckFailed, DatasetCheckHook
from .exit_status import (BAD_INPUT_EXIT_CODE, PREEMPTED_EXIT_CODE, BadInput,
                          RunStopped)
from .optimizers import (LrFactorOptimWrapperConstructor,
                         ViTLayerDecayOptimWrapperConstructor)
from .padding_mask_hook import BackbonePaddingMaskHook
from .plain_checkpoint_hook import PlainCheckpointHook
from .plain_param_groups_hook import PlainParamGroupsHook, plain_param_groups
from .plain_state import from_plain, non_plain_paths, to_plain
from .preemption_hook import PreemptionHook, TrainingPreempted
from .preemption_workers import SignalTolerantWorkerInit, TrainingFlag
from .resumable_loop import ResumableEpochBasedTrainLoop
from .resume_checkpoint import (checkpoint_dirs, checkpoint_load_error,
                                find_resumable_checkpoint, resume_candidates)
from .rng_state_hook import RNGStateHook
from .rtdetr_ema import RTDETREMA, rtdetr_ema_decay
from .runner import MMPERunner, build_tool_runner, use_mmpe_runner
from .runtime import RUNTIME_HOOKS, complete_runtime
from .safe_checkpoint import (UNSAFE_LOAD_ENV, UnsafeCheckpointError,
                              load_from_local_safe, rebuild_history_buffer,
                              safe_checkpoint_loading)

__all__ = [
    'ATOMIC_BACKEND', 'AtomicCheckpointHook', 'AtomicLocalBackend',
    'AutocastOptimWrapper', 'BAD_INPUT_EXIT_CODE', 'BackbonePaddingMaskHook',
    'BatchResizeStopHook',
    'BadInput', 'DatasetCheckFailed', 'DatasetCheckHook',
    'LrFactorOptimWrapperConstructor', 'MMPERunner',
    'PREEMPTED_EXIT_CODE', 'PlainCheckpointHook', 'PlainParamGroupsHook',
    'PreemptionHook', 'RNGStateHook', 'RTDETREMA', 'RUNTIME_HOOKS',
    'ResumableEpochBasedTrainLoop', 'RunStopped', 'SignalTolerantWorkerInit',
    'TrainingFlag', 'TrainingPreempted', 'UNSAFE_LOAD_ENV',
    'UnsafeCheckpointError', 'ViTLayerDecayOptimWrapperConstructor',
    'checkpoint_dirs', 'checkpoint_load_error', 'complete_runtime',
    'find_resumable_checkpoint', 'from_plain', 'load_from_local_safe',
    'non_plain_paths', 'plain_param_groups', 'rebuild_history_buffer',
    'resume_candidates', 'rtdetr_ema_decay', 'safe_checkpoint_loading',
    'to_plain',
    'use_mmpe_runner', 'build_tool_runner'
]
