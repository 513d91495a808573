"""Test (and evaluate) a detector or segmentor checkpoint with MMEngine's
Runner (the config's ``default_scope``, 'mmdet' or 'mmseg', picks the
registries; ``--out`` is a .pkl of detections or a folder of label maps).

Same flags as mmdet's ``tools/test.py`` (without TTA); mmpe's modules are
registered, the runner is ``MMPERunner`` (``configs/_base_/runtime_mmpe.py``;
set here on configs without a runner) and the checkpoint loads weights-only,
through ``mmpe.engine.safe_checkpoint_loading`` (``--allow-unsafe-checkpoint``
for trusted files that need more). The config's ``DatasetCheckHook`` checks
the test set first: problems are all listed and the script exits with
status 2.

    python tools/test.py CONFIG CHECKPOINT [--out results.pkl]
"""
import argparse
import os.path as osp
import sys

import mmpe  # noqa: F401  (registers modules)
from mmpe.engine import build_tool_runner, safe_checkpoint_loading
from mmpe.utils import (DataNotFoundError, check_data_paths,
                        finalize_distributed)
from mmpe.utils.tool_args import (add_runner_args, dump_detections,
                                  parse_tool_args, runner_config)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Test (and eval) a detector checkpoint')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--work-dir',
        help='the directory to save the file containing evaluation metrics')
    parser.add_argument(
        '--out',
        type=str,
        help='dump predictions to a pickle file for offline evaluation '
        '(segmentation configs: a folder for the predicted label maps)')
    parser.add_argument(
        '--show', action='store_true', help='show prediction results')
    parser.add_argument(
        '--show-dir',
        help='directory (inside the work dir\'s timestamp folder) where '
        'painted images are saved')
    parser.add_argument(
        '--wait-time', type=float, default=2, help='the interval of show (s)')
    add_runner_args(parser)
    return parse_tool_args(parser, argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = runner_config(args)
    if not osp.isfile(args.checkpoint):
        print(f'error: checkpoint {args.checkpoint!r} does not exist',
              file=sys.stderr)
        return 2
    cfg.load_from = args.checkpoint
    try:
        check_data_paths(cfg, ('test', ))
    except DataNotFoundError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2

    if args.show or args.show_dir:
        hooks = cfg.default_hooks
        if 'visualization' not in hooks:
            raise RuntimeError('"visualization" is missing in '
                               'default_hooks of the config')
        hooks.visualization.draw = True
        if args.show:
            hooks.visualization.show = True
            hooks.visualization.wait_time = args.wait_time
        if args.show_dir:
            hooks.visualization.test_out_dir = args.show_dir

    if args.out is not None and cfg.get('default_scope') == 'mmseg':
        # segmentation: mmseg's IoUMetric writes the predicted label maps
        # (PNG) into the --out folder, as mmseg's own tools/test.py
        cfg.test_evaluator['output_dir'] = args.out
        cfg.test_evaluator['keep_results'] = True
    elif args.out is not None:
        try:
            dump_detections(cfg, args.out)
        except ValueError as err:
            print(f'error: {err}', file=sys.stderr)
            return 2
    runner = build_tool_runner(
        cfg, args.launcher, say=lambda note: print(note, file=sys.stderr))
    with safe_checkpoint_loading(args.allow_unsafe_checkpoint):
        metrics = runner.test()
    finalize_distributed()
    return 0 if metrics is not None else 1


if __name__ == '__main__':
    sys.exit(main())
