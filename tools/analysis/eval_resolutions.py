"""Evaluate one checkpoint at several test resolutions, without fine-tuning.

Every ``Resize`` of the test pipeline has its ``scale`` (or
``scale_factor``) multiplied by each factor; a pipeline without a Resize
(images at their own size) gets ``Resize(scale_factor=factor)`` after the
image is loaded. The model is the same checkpoint throughout, as in CPVT's experiments on generalising to
larger test resolutions (Chu et al., Sec. 4)::

    python tools/analysis/eval_resolutions.py CONFIG CKPT --scales 1.0 1.5 2.0

prints AP / AP50 per scale (bbox, and segm when evaluated) and writes them
to ``WORK_DIR/eval_resolutions.json``.
"""
import argparse
import copy
import json
import os
import os.path as osp
from typing import Dict, List, Union

from mmengine.config import Config, DictAction


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Test one checkpoint at several input resolutions')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--scales',
        type=float,
        nargs='+',
        default=[1.0],
        help='factors applied to the test pipeline Resize scale')
    parser.add_argument(
        '--work-dir',
        help='where logs and eval_resolutions.json go (default: '
        './work_dirs/CONFIG_NAME/eval_resolutions)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, as tools/test.py')
    args = parser.parse_args()
    if any(s <= 0 for s in args.scales):
        parser.error(f'--scales must be positive, got {args.scales}')
    return args


def _scaled(value: Union[int, float, tuple, list], factor: float):
    if isinstance(value, (tuple, list)):
        return type(value)(_scaled(v, factor) for v in value)
    if isinstance(value, int):
        return max(1, int(round(value * factor)))
    return value * factor


def rescale_pipeline(pipeline: List[dict], factor: float) -> List[str]:
    """Multiply every Resize's ``scale`` / ``scale_factor`` in place.

    Wrappers with nested ``transforms`` (e.g. ``TestTimeAug``) are searched
    too. Returns a description of what changed, one line per transform.
    """
    changed = []
    for transform in pipeline:
        if not isinstance(transform, dict):
            continue
        if 'Resize' in str(transform.get('type', '')):
            for key in ('scale', 'scale_factor'):
                if transform.get(key) is not None:
                    old = transform[key]
                    transform[key] = _scaled(old, factor)
                    changed.append(f"{transform['type']}.{key}: {old} -> "
                                   f'{transform[key]}')
        for key in ('transforms', 'pipeline'):
            nested = transform.get(key)
            if isinstance(nested, list):
                # TestTimeAug holds a list of lists of transforms
                for item in nested:
                    changed += rescale_pipeline(
                        item if isinstance(item, list) else [item], factor)
    return changed


def rescale_or_insert(pipeline: List[dict], factor: float) -> List[str]:
    """:func:`rescale_pipeline`, or insert a Resize by ``factor`` if none.

    The inserted ``Resize(scale_factor=factor, keep_ratio=True)`` goes right
    after the image loading transform (before annotations are loaded, as in
    mmdet's test pipelines); nothing is inserted for ``factor == 1``.
    """
    changed = rescale_pipeline(pipeline, factor)
    if changed or factor == 1:
        return changed or ['no Resize in the test pipeline: native size']
    index = next((i + 1 for i, t in enumerate(pipeline)
                  if 'LoadImage' in str(t.get('type', ''))), 0)
    pipeline.insert(
        index, dict(type='Resize', scale_factor=factor, keep_ratio=True))
    return [f'inserted Resize(scale_factor={factor:g}) at position {index}']


def _test_pipeline(cfg: Config) -> List[dict]:
    dataset = cfg.test_dataloader.dataset
    while 'pipeline' not in dataset and 'dataset' in dataset:
        dataset = dataset.dataset  # dataset wrappers
    return dataset.pipeline


def _summary(metrics: Dict[str, float]) -> Dict[str, float]:
    """Keep the ``*_mAP`` and ``*_mAP_50`` entries (bbox, segm)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if k.endswith('_mAP') or k.endswith('_mAP_50')
    }


def main() -> None:
    args = parse_args()
    import mmpe  # noqa: F401  (registers mmpe modules; safe loading)
    from mmengine.runner import Runner

    from mmpe.engine import safe_checkpoint_loading

    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    work_dir = args.work_dir or osp.join(
        './work_dirs',
        osp.splitext(osp.basename(args.config))[0], 'eval_resolutions')
    os.makedirs(work_dir, exist_ok=True)

    results = []
    for factor in args.scales:
        run_cfg = copy.deepcopy(cfg)
        changed = rescale_or_insert(_test_pipeline(run_cfg), factor)
        run_cfg.load_from = args.checkpoint
        run_cfg.resume = False
        run_cfg.work_dir = osp.join(work_dir, f'scale_{factor:g}')
        run_cfg.launcher = 'none'
        print(f'[eval_resolutions] scale x{factor:g}: ' + '; '.join(changed))
        with safe_checkpoint_loading():  # weights-only, also older files
            metrics = Runner.from_cfg(run_cfg).test()
        results.append(
            dict(scale=factor, resize=changed, metrics=_summary(metrics)))

    names = sorted({k for r in results for k in r['metrics']})
    header = ['scale'] + [n.split('/')[-1] for n in names]
    rows = [[f"x{r['scale']:g}"] +
            [f"{r['metrics'].get(n, float('nan')):.3f}" for n in names]
            for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows))
              for i, h in enumerate(header)]
    lines = [' | '.join(h.ljust(w) for h, w in zip(header, widths))]
    lines.append('-+-'.join('-' * w for w in widths))
    lines += [
        ' | '.join(c.ljust(w) for c, w in zip(row, widths)) for row in rows
    ]
    print('\n'.join(lines))
    out_file = osp.join(work_dir, 'eval_resolutions.json')
    with open(out_file, 'w') as f:
        json.dump(
            dict(config=args.config, checkpoint=args.checkpoint,
                 results=results), f, indent=2)
    print(f'[eval_resolutions] wrote {out_file}')


if __name__ == '__main__':
    main()
