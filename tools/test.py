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
import os
import os.path as osp
import sys

from mmengine.config import Config, DictAction

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..'))
import mmpe  # noqa: E402,F401  (registers modules)
from mmdet.registry import RUNNERS  # noqa: E402
from mmpe.engine import (UNSAFE_LOAD_ENV, safe_checkpoint_loading,  # noqa
                         use_mmpe_runner)
from mmpe.utils import (DataNotFoundError, check_data_paths,  # noqa: E402
                        finalize_distributed, fix_worker_settings,
                        prepare_cpu_distributed)


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
    parser.add_argument(
        '--allow-unsafe-checkpoint',
        action='store_true',
        help=f'load a trusted checkpoint that needs full unpickling (sets '
        f'{UNSAFE_LOAD_ENV}=1)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override settings in the config, key=value pairs')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.allow_unsafe_checkpoint:
        os.environ[UNSAFE_LOAD_ENV] = '1'
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)

    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
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
        if not args.out.endswith(('.pkl', '.pickle')):
            print(f'error: --out must be a .pkl or .pickle file, got '
                  f'{args.out!r}', file=sys.stderr)
            return 2
        cfg.test_evaluator = [cfg.test_evaluator] if isinstance(
            cfg.test_evaluator, dict) else list(cfg.test_evaluator)
        cfg.test_evaluator.append(
            dict(type='DumpDetResults', out_file_path=args.out))
    for note in use_mmpe_runner(cfg):
        print(note, file=sys.stderr)
    fix_worker_settings(cfg)
    prepare_cpu_distributed(cfg, args.launcher)

    runner = RUNNERS.build(cfg)  # cfg.runner_type, as mmdet's tools
    with safe_checkpoint_loading():
        metrics = runner.test()
    finalize_distributed()
    return 0 if metrics is not None else 1


if __name__ == '__main__':
    sys.exit(main())
