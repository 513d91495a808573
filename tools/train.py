"""Train a detector or segmentor with mmpe's runner; mmpe's modules are
registered.

Same flags as mmdet's ``tools/train.py``, plus ``--overwrite`` (a fresh run
refuses to replace the checkpoints of an earlier run in the same work dir)
and ``--allow-unsafe-checkpoint`` (see ``mmpe.engine.safe_checkpoint``).

mmpe's configs inherit ``configs/_base_/runtime_mmpe.py``, which declares
the runner (``MMPERunner``) and the hooks, so this script, mmdet's and
mmseg's ``tools/train.py`` and ``mim train`` all build the same runner
(docs/user_guides/plugin.md). A config without it (a user's own mmdet
config) gets ``runner_type = 'MMPERunner'`` here; the runner then adds the
missing pieces and says so in one log line:

* ``PlainCheckpointHook``: checkpoints hold only tensors, numbers, strings,
  lists, tuples and dicts and open with stock
  ``torch.load(weights_only=True)`` without mmpe;
* ``AtomicCheckpointHook`` for ``CheckpointHook``: checkpoints and
  ``last_checkpoint`` written atomically;
* ``PreemptionHook``: SIGTERM / SIGUSR1 save ``iter_N.pth`` after the
  current iteration and exit with status 75;
* ``ResumableEpochBasedTrainLoop`` for ``EpochBasedTrainLoop``: mid-epoch
  resume; ``RNGStateHook``: exact resume;
* ``PlainParamGroupsHook``: ``--cfg-options compile=True`` can trace
  ``optimizer.step()``;
* ``DatasetCheckHook``: the train and val sets are checked before the
  first step (every image decoded as the pipeline reads it, annotations,
  label maps); problems are all listed and the run exits with status 2
  (docs/user_guides/dataset_check.md).

The runner loads every checkpoint weights-only and ``--resume`` skips a
newest checkpoint that does not load. Exit status: 0 done, 2 bad input
(data, work dir, a --resume checkpoint that does not load), 75 preempted
(resume); see ``mmpe.engine.exit_status``.

    python tools/train.py configs/quickstart/detr_irpe_r18_synthetic.py
    bash tools/dist_train.sh CONFIG 2        # DDP via torchrun
"""
import argparse
import gc
import sys

import torch
from mmengine.config import Config

import mmpe  # noqa: F401  (registers modules)
from mmpe.engine import (PREEMPTED_EXIT_CODE, TrainingPreempted,
                         build_tool_runner, safe_checkpoint_loading)
from mmpe.utils import (DataNotFoundError, check_data_paths, check_work_dir,
                        finalize_distributed)
from mmpe.utils.tool_args import (add_runner_args, parse_tool_args,
                                  runner_config)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a detector')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--amp',
        action='store_true',
        default=False,
        help='mixed precision: fp16 on CUDA, bf16 autocast on CPU')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='scale the learning rate by total batch size / base batch size')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from the given checkpoint, or with no value from the '
        'latest checkpoint in the work dir')
    parser.add_argument(
        '--overwrite',
        action='store_true',
        help='start a fresh run even if the work dir holds checkpoints')
    add_runner_args(parser)
    return parse_tool_args(parser, argv)


def build_cfg(args) -> Config:
    """Load the config and apply the command-line flags, as mmdet does."""
    cfg = runner_config(args)

    if args.amp:
        optim_wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if optim_wrapper == 'AmpOptimWrapper':
            print('AMP training is already enabled in your config.')
        elif torch.cuda.is_available():
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.loss_scale = 'dynamic'
        else:
            # mmengine's AmpOptimWrapper needs a GPU; bf16 autocast on CPU
            # needs no loss scaling.
            cfg.optim_wrapper.type = 'AutocastOptimWrapper'
            cfg.optim_wrapper.dtype = 'bfloat16'

    if args.auto_scale_lr:
        if 'auto_scale_lr' in cfg and 'enable' in cfg.auto_scale_lr \
                and 'base_batch_size' in cfg.auto_scale_lr:
            cfg.auto_scale_lr.enable = True
        else:
            raise RuntimeError('Can not find "auto_scale_lr" or '
                               '"auto_scale_lr.enable" or '
                               '"auto_scale_lr.base_batch_size" in your '
                               'configuration file.')

    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    return cfg


def main(argv=None):
    args = parse_args(argv)
    cfg = build_cfg(args)
    splits = ('train', 'val') if cfg.get('val_cfg') else ('train', )
    try:
        check_data_paths(cfg, splits)
        check_work_dir(cfg.work_dir, cfg.get('resume'), args.overwrite)
    except (DataNotFoundError, FileExistsError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    runner = build_tool_runner(
        cfg, args.launcher, say=lambda note: print(note, file=sys.stderr))
    # the runner stops a run on bad input (status 2) by SystemExit
    status = 0
    try:
        with safe_checkpoint_loading(args.allow_unsafe_checkpoint):
            runner.train()
    except TrainingPreempted as stop:
        print(f'preempted: {stop}', file=sys.stderr)
        status = PREEMPTED_EXIT_CODE
    # The runner's loops and hooks refer to it (cycles): collect it now, so
    # persistent dataloader workers are shut down by their iterator instead
    # of being terminated at interpreter exit (torch reports that as an
    # error).
    del runner
    gc.collect()
    finalize_distributed()
    return status


if __name__ == '__main__':
    sys.exit(main())
