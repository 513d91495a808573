"""Evaluate one checkpoint at several test resolutions, without fine-tuning.

Works for any MMDetection / mmpe detector config with a test split: the DETR
family (DETR, Conditional DETR, DAB-DETR, with or without iRPE), Mask R-CNN
and RetinaNet with CPVT / DeiT-iRPE backbones, plain mmdet configs. For each
factor, every pipeline of the test data set (wrappers and ``ConcatDataset``
included) is rescaled:

* resize transforms (``Resize``, ``RandomResize``, ``RandomChoiceResize``,
  ``FixShapeResize``, ``ResizeShortestEdge``, nested in ``TestTimeAug`` too)
  get their target sizes (``scale``, ``scales``, ``width``, ``height``,
  ``max_size``) and ``scale_factor`` multiplied by the factor;
* ``Pad`` with a fixed ``size`` gets it multiplied too (else it would refuse
  the larger images);
* a pipeline without any resize (images at their own size) gets
  ``Resize(scale_factor=factor, keep_ratio=True)`` after the image is loaded.

The model is the same checkpoint throughout, as in CPVT's experiments on
generalising to larger test resolutions (Chu et al., Sec. 4)::

    python tools/analysis/eval_resolutions.py CONFIG CKPT --scales 1.0 1.5 2.0

A resized test changes two things at once: the images are larger (longer
token sequences) *and* so are the objects. ``--canvas 2.0`` separates
them for mmpe's embedded data set: the test set is drawn again by its
generator (same parameters, read from its meta file) on a canvas twice as
large per side, with objects of the same sizes in pixels and the same
expected number per unit area (:mod:`mmpe.datasets.synthetic_image`), and
the test pipeline's resize sizes are scaled by the same factor, so that
each image is resized by the factor its un-enlarged twin would get: the
model sees the training object scale on an image twice as large (more
objects, longer sequences). The set is written once, beside the original
(``<data_root>_canvas2``; never overwriting other data), and reused::

    python tools/analysis/eval_resolutions.py CONFIG CKPT \
        --scales 1.0 1.5 2.0 --canvas 2.0

Each scale is one ``Runner.test()`` (its logs under ``WORK_DIR/scale_<f>``,
``WORK_DIR/canvas_<f>`` for the canvas tests),
loading the checkpoint weights-only as ``tools/test.py`` does
(``--allow-unsafe-checkpoint`` for trusted files that need more). Prints AP
per scale (the ``*_mAP`` / ``*_mAP_50`` metrics: bbox, and segm when
evaluated) with the largest image the model was given, and writes every
numeric metric and the image sizes seen to ``WORK_DIR/eval_resolutions.json``.
"""
import argparse
import gc
import json
import os
import os.path as osp
import sys
from typing import Dict, List, Optional, Sequence

from mmengine.config import Config
from mmengine.hooks import Hook
from resolution_configs import (canvas_config, dataset_pipelines,
                                scale_config, test_data_root)

from mmpe.datasets.synthetic_canvas import canvas_twin
from mmpe.utils.tool_args import (add_cfg_options, add_unsafe_checkpoint,
                                  default_work_dir, load_config)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Test one checkpoint at several input resolutions')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--scales',
        type=float,
        nargs='+',
        default=[1.0],
        help='factors applied to the test pipeline resize sizes')
    parser.add_argument(
        '--canvas',
        type=float,
        nargs='+',
        default=[],
        help='factors (> 1) of the canvas test: the embedded test set drawn '
        'on a canvas this much larger per side at the same object sizes, '
        'the pipeline resize scaled alike')
    parser.add_argument(
        '--work-dir',
        help='where logs and eval_resolutions.json go (default: '
        'WORK_DIR/eval_resolutions, WORK_DIR from the config or '
        './work_dirs/CONFIG_NAME)')
    add_unsafe_checkpoint(parser)
    add_cfg_options(parser)
    args = parser.parse_args(argv)
    if any(s <= 0 for s in args.scales):
        parser.error(f'--scales must be positive, got {args.scales}')
    if len({f'{s:g}' for s in args.scales}) != len(args.scales):
        parser.error(f'--scales must not repeat, got {args.scales}')
    if any(not 1 < c <= 16 for c in args.canvas):
        parser.error(f'--canvas factors must be in (1, 16], got '
                     f'{args.canvas}')
    if len({f'{c:g}' for c in args.canvas}) != len(args.canvas):
        parser.error(f'--canvas must not repeat, got {args.canvas}')
    return args


class ImageShapeHook(Hook):
    """Record each test image's ``img_shape`` (h, w), as the model got it."""

    priority = 'LOW'

    def __init__(self) -> None:
        self.shapes: List[tuple] = []

    def after_test_iter(self, runner, batch_idx, data_batch=None,
                        outputs=None) -> None:
        for sample in outputs or []:
            shape = getattr(sample, 'metainfo', {}).get('img_shape')
            if shape is not None:
                self.shapes.append(tuple(int(v) for v in shape[:2]))

    def summary(self) -> Dict[str, object]:
        """Image count, largest and mean (h, w)."""
        if not self.shapes:
            return dict(num_images=0)
        hs, ws = zip(*self.shapes)
        return dict(
            num_images=len(self.shapes),
            max_img_shape=[max(hs), max(ws)],
            mean_img_shape=[sum(hs) / len(hs), sum(ws) / len(ws)])


def canvas_data(cfg: Config, factor: float) -> str:
    """Write (or find) the canvas twin of ``cfg``'s embedded test set
    (:func:`~mmpe.datasets.synthetic_canvas.canvas_twin`) and return its
    data root; ``ValueError`` / ``FileExistsError`` as that function."""
    return canvas_twin(test_data_root(cfg), factor)


def evaluate(run_cfg: Config, allow_unsafe: bool = False) -> tuple:
    """``Runner.test()`` with weights-only checkpoint loading
    (``allow_unsafe``: ``--allow-unsafe-checkpoint``).

    Returns:
        tuple[dict, dict]: The metrics and :meth:`ImageShapeHook.summary`.
    """
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    from mmpe.engine import safe_checkpoint_loading

    if 'runner_type' in run_cfg:
        runner = RUNNERS.build(run_cfg)
    else:
        runner = Runner.from_cfg(run_cfg)
    shapes = ImageShapeHook()
    runner.register_hook(shapes)
    with safe_checkpoint_loading(allow_unsafe):
        metrics = runner.test()
    del runner
    gc.collect()
    return dict(metrics or {}), shapes.summary()


def _numeric(metrics: Dict[str, object]) -> Dict[str, float]:
    out = {}
    for key, value in metrics.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            pass  # e.g. copy-paste strings
    return out


def _ap_names(names: List[str]) -> List[str]:
    """The AP columns: ``*_mAP`` / ``*_mAP_50`` (COCO) or ``*/mAP`` (VOC);
    every metric when none of those is there."""
    ap = [
        n for n in names
        if n.endswith(('_mAP', '_mAP_50')) or n.split('/')[-1] == 'mAP'
    ]
    return ap or names


def format_table(results: List[dict]) -> str:
    names = _ap_names(sorted({k for r in results for k in r['metrics']}))
    header = ['scale'] + [n.split('/')[-1] for n in names] + ['max HxW']
    rows = []
    for r in results:
        shape = r['images'].get('max_img_shape')
        label = f"x{r['scale']:g}"
        if r.get('test') == 'canvas':
            label += ' canvas'
        rows.append([label] + [
            f"{r['metrics'].get(n, float('nan')):.3f}" for n in names
        ] + [f'{shape[0]}x{shape[1]}' if shape else '-'])
    widths = [max(len(h), *(len(row[i]) for row in rows))
              for i, h in enumerate(header)]
    lines = [' | '.join(h.ljust(w) for h, w in zip(header, widths))]
    lines.append('-+-'.join('-' * w for w in widths))
    lines += [
        ' | '.join(c.ljust(w) for c, w in zip(row, widths)) for row in rows
    ]
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    from mmpe.utils import DataNotFoundError, check_data_paths

    if not osp.isfile(args.checkpoint):
        print(f'error: checkpoint {args.checkpoint!r} does not exist',
              file=sys.stderr)
        return 2
    cfg = load_config(args.config, args.cfg_options)
    try:
        dataset_pipelines(cfg)
        check_data_paths(cfg, ('test', ))
        canvas_roots = [canvas_data(cfg, c) for c in args.canvas]
    except (ValueError, DataNotFoundError, FileExistsError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    work_dir = args.work_dir or osp.join(
        cfg.get('work_dir') or default_work_dir(args.config),
        'eval_resolutions')
    os.makedirs(work_dir, exist_ok=True)

    results = []
    tests = [('resize', f, None) for f in args.scales] + [
        ('canvas', c, root) for c, root in zip(args.canvas, canvas_roots)
    ]
    for test, factor, canvas_root in tests:
        if test == 'resize':
            run_cfg, changed = scale_config(cfg, factor, args.checkpoint,
                                            work_dir)
        else:
            run_cfg, changed = canvas_config(cfg, factor, args.checkpoint,
                                             work_dir, canvas_root)
        print(f'[eval_resolutions] {test} x{factor:g}: ' + '; '.join(changed))
        metrics, images = evaluate(run_cfg, args.allow_unsafe_checkpoint)
        results.append(
            dict(
                test=test,
                scale=factor,
                resize=changed,
                images=images,
                metrics=_numeric(metrics)))

    print(format_table(results))
    out_file = osp.join(work_dir, 'eval_resolutions.json')
    with open(out_file, 'w') as f:
        json.dump(
            dict(config=args.config, checkpoint=args.checkpoint,
                 results=results), f, indent=2)
    print(f'[eval_resolutions] wrote {out_file}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
