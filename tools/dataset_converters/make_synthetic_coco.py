r"""Generate mmpe's embedded COCO-format data set (boxes + instance masks).

    python tools/dataset_converters/make_synthetic_coco.py
    python tools/dataset_converters/make_synthetic_coco.py \
        --num-train 200 --out-dir /tmp/synthetic_coco
    # a test set on a canvas twice as large per side, same object sizes
    python tools/dataset_converters/make_synthetic_coco.py --num-train 0 \
        --canvas 2 --out-dir data/synthetic_coco_canvas2

Re-running with the same arguments is a no-op; existing data made with
other arguments (or not by this tool) is never replaced unless
``--overwrite`` is given. See ``mmpe/datasets/synthetic_coco.py`` for the
design of the data.
"""
import argparse
import importlib.util
import os.path as osp
import sys
from types import ModuleType

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))


def load_generator() -> ModuleType:
    """The ``mmpe/datasets`` package on its own (numpy + OpenCV only).

    ``import mmpe`` would also import torch and mmdet to register the models
    (several seconds), which generating images does not need. Loaded as a
    package so that its modules' relative imports resolve.
    """
    pkg_dir = osp.join(ROOT, 'mmpe', 'datasets')
    spec = importlib.util.spec_from_file_location(
        '_mmpe_datasets',
        osp.join(pkg_dir, '__init__.py'),
        submodule_search_locations=[pkg_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Generate the synthetic COCO-format detection and '
        'instance-segmentation data set (deterministic under --seed).')
    parser.add_argument(
        '--out-dir',
        default='data/synthetic_coco',
        help='data root (default: %(default)s)')
    parser.add_argument(
        '--num-train',
        type=int,
        default=800,
        help='training images (default: %(default)s)')
    parser.add_argument(
        '--num-val',
        type=int,
        default=100,
        help='validation images (default: %(default)s)')
    parser.add_argument(
        '--seed', type=int, default=0, help='base seed (default: %(default)s)')
    parser.add_argument(
        '--min-size',
        type=int,
        default=128,
        help='smallest image long side in px (default: %(default)s)')
    parser.add_argument(
        '--max-size',
        type=int,
        default=256,
        help='largest image long side in px (default: %(default)s)')
    parser.add_argument(
        '--max-objects',
        type=int,
        default=3,
        help='most objects per image (default: %(default)s)')
    parser.add_argument(
        '--object-hue',
        choices=('class', 'random'),
        default='class',
        help="'class': each class in its own hue; 'random': any hue, so "
        'only the shape tells the classes apart (default: %(default)s)')
    parser.add_argument(
        '--canvas',
        type=float,
        default=1.0,
        help='image sides times this factor (>= 1) at the same object '
        'sizes in pixels and objects per area: more objects, longer '
        'sequences (default: %(default)s)')
    parser.add_argument(
        '--img-format',
        choices=('jpg', 'png'),
        default='jpg',
        help='image file format (default: %(default)s)')
    parser.add_argument(
        '--overwrite',
        action='store_true',
        help='replace an existing data set in --out-dir')
    return parser.parse_args(argv)


def generate(generator, args: argparse.Namespace, **extra):
    """``generator(args.out_dir, ...)`` with the options both data set tools
    share (and ``extra``); its summary, or None when it refused (data made
    otherwise, bad values: said on stderr)."""
    try:
        return generator(
            args.out_dir,
            num_train=args.num_train,
            num_val=args.num_val,
            seed=args.seed,
            min_size=args.min_size,
            max_size=args.max_size,
            max_objects=args.max_objects,
            object_hue=args.object_hue,
            img_format=args.img_format,
            overwrite=args.overwrite,
            **extra)
    except (FileExistsError, ValueError) as e:
        print(f'error: {e}', file=sys.stderr)
        return None


def main(argv=None) -> int:
    args = parse_args(argv)
    summary = generate(load_generator().generate_synthetic_coco, args,
                       canvas=args.canvas)
    if summary is None:
        return 2
    if summary.skipped:
        print(f'{args.out_dir}: already generated with these parameters, '
              'nothing written')
    else:
        print(f'wrote {args.out_dir}:')
    for split, ann_file in summary.ann_files.items():
        print(f'  {split}: {summary.num_images.get(split, 0)} images in '
              f'{summary.img_dirs[split]}/, '
              f'{summary.num_instances.get(split, 0)} instances in {ann_file}')
    print(f'took {summary.seconds:.1f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
