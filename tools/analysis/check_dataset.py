"""Check a config's data sets without training: the check that
``DatasetCheckHook`` runs before a run's first step, on its own.

Every image is read and decoded as the config's ``LoadImageFromFile`` reads
it and compared with its annotated size; COCO annotation files are checked
for boxes (finite, positive size, inside the image within a pixel),
categories, polygons (>= 3 points), RLE masks and NaN / inf; segmentation
label maps for their size and values (docs/user_guides/dataset_check.md).
Everything wrong is listed at once (file, annotation id, reason) with a
count per reason. Results are cached per file (path, size, modification
time), so a second run reads only what changed.

    python tools/analysis/check_dataset.py CONFIG [--splits train val]
        [--num-workers 8] [--no-cache] [--cfg-options KEY=VALUE ...]

Exit status: 0 no problems, 2 problems (or a missing annotation file).
"""
import argparse
import sys

from mmengine.config import Config
from mmengine.registry import DATASETS, init_default_scope

import mmpe  # noqa: F401  (registers modules)
from mmpe.datasets.data_check import (DEFAULT_CACHE, CheckOptions,
                                      check_dataset, format_report)
from mmpe.engine.runtime import type_name
from mmpe.utils import DataNotFoundError, check_data_paths
from mmpe.utils.tool_args import add_cfg_options, load_config

SPLITS = ('train', 'val', 'test')
HOOK_NAMES = ('DatasetCheckHook', 'SegLabelCheckHook')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Check the data sets of a config before training')
    parser.add_argument('config', help='config file path')
    parser.add_argument(
        '--splits', nargs='+', choices=SPLITS, default=list(SPLITS),
        help='which <split>_dataloader data sets to check (default: all; a '
        'test set equal to the val set is checked once)')
    parser.add_argument(
        '--num-workers', type=int, default=None,
        help='processes reading files (default: each loader\'s num_workers)')
    parser.add_argument(
        '--no-cache', action='store_true',
        help='read every file, and keep no results for the next check')
    parser.add_argument(
        '--max-listed', type=int, default=0,
        help='problems listed per data set (default 0: all)')
    add_cfg_options(parser)
    args = parser.parse_args(argv)
    if args.num_workers is not None and args.num_workers < 0:
        parser.error(f'--num-workers must be >= 0, got {args.num_workers}')
    return args


def hook_settings(cfg: Config) -> dict:
    """The config's ``DatasetCheckHook`` arguments (cache, ignore index)."""
    for hook in cfg.get('custom_hooks', None) or []:
        if isinstance(hook, dict) and type_name(hook) in HOOK_NAMES:
            return dict(hook)
    return {}


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    splits = [s for s in args.splits if cfg.get(f'{s}_dataloader')]
    if 'test' in splits and 'val' in splits and \
            cfg.test_dataloader.dataset == cfg.val_dataloader.dataset:
        splits.remove('test')
    try:
        check_data_paths(cfg, tuple(splits))
    except DataNotFoundError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    hook = hook_settings(cfg)
    status = 0
    for split in splits:
        loader = cfg[f'{split}_dataloader']
        dataset = DATASETS.build(loader.dataset)
        workers = args.num_workers if args.num_workers is not None else \
            loader.get('num_workers', 0)
        options = CheckOptions(
            num_workers=workers,
            cache_dir=None if args.no_cache else hook.get(
                'cache_dir', DEFAULT_CACHE),
            ignore_index=hook.get('ignore_index', 255))
        result = check_dataset(dataset, f'{split} set', options)
        if not result.problems:
            print(f'{split}: no problems: {result.summary()}')
        else:
            status = 2
            files = len({p.file for p in result.problems})
            print(f'{split}: {len(result.problems)} problem(s) in {files} '
                  f'file(s) of the {result.name} ({result.source}):')
            print('\n'.join(format_report(result.problems, args.max_listed)))
            print(f'  {result.summary()}')
        for note in result.notes:
            print(f'  note: {note}')
    return status


if __name__ == '__main__':
    sys.exit(main())
