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
import copy
import gc
import json
import os
import os.path as osp
import sys
from typing import Dict, List, Optional, Sequence, Union

from mmengine.config import Config, DictAction
from mmengine.hooks import Hook

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))

#: Size fields of resize transforms, in pixels (rounded to int when int).
SIZE_KEYS = ('scale', 'scales', 'width', 'height', 'max_size')


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
    parser.add_argument(
        '--allow-unsafe-checkpoint',
        action='store_true',
        help='load a trusted checkpoint that needs full unpickling')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, as tools/test.py')
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


def _scaled(value: Union[int, float, tuple, list], factor: float,
            integer: bool = True):
    """``value * factor``, element-wise; ints stay (rounded, >= 1) ints
    when ``integer`` (pixel sizes), become floats otherwise (factors)."""
    if isinstance(value, (tuple, list)):
        return type(value)(_scaled(v, factor, integer) for v in value)
    if integer and isinstance(value, int):
        return max(1, int(round(value * factor)))
    return value * factor


def _type_name(transform: dict) -> str:
    kind = transform.get('type', '')
    return kind if isinstance(kind, str) else getattr(kind, '__name__',
                                                      str(kind))


def rescale_pipeline(pipeline: List[dict], factor: float) -> List[str]:
    """Multiply the sizes of every resize (and fixed-size ``Pad``) in place.

    Resize transforms (type name containing ``Resize``) get
    :data:`SIZE_KEYS` and ``scale_factor`` scaled, ``Pad`` its ``size``.
    Wrappers with nested ``transforms`` (e.g. ``TestTimeAug``, a list of
    lists) are searched too.

    Returns:
        list[str]: What changed, ``'<type>.<key>: <old> -> <new>'`` each.
    """
    changed = []
    for transform in pipeline:
        if not isinstance(transform, dict):
            continue
        name = _type_name(transform)
        keys = []
        if 'Resize' in name:
            keys = [(k, True) for k in SIZE_KEYS] + [('scale_factor', False)]
        elif name.split('.')[-1] == 'Pad':
            keys = [('size', True)]
        for key, integer in keys:
            if transform.get(key) is not None:
                old = transform[key]
                transform[key] = _scaled(old, factor, integer)
                changed.append(f'{name}.{key}: {old} -> {transform[key]}')
        for key in ('transforms', 'pipeline'):
            nested = transform.get(key)
            if isinstance(nested, list):
                for item in nested:
                    changed += rescale_pipeline(
                        item if isinstance(item, list) else [item], factor)
    return changed


def _has_resize(pipeline: List[dict]) -> bool:
    for transform in pipeline:
        if not isinstance(transform, dict):
            continue
        if 'Resize' in _type_name(transform):
            return True
        for key in ('transforms', 'pipeline'):
            nested = transform.get(key)
            if isinstance(nested, list) and any(
                    _has_resize(i if isinstance(i, list) else [i])
                    for i in nested):
                return True
    return False


def rescale_or_insert(pipeline: List[dict], factor: float) -> List[str]:
    """:func:`rescale_pipeline`, or insert a Resize by ``factor`` if none.

    The inserted ``Resize(scale_factor=factor, keep_ratio=True)`` goes right
    after the image loading transform (before annotations are loaded, as in
    mmdet's test pipelines); nothing is inserted for ``factor == 1``.
    """
    if _has_resize(pipeline):
        return rescale_pipeline(pipeline, factor)
    changed = rescale_pipeline(pipeline, factor)  # a fixed-size Pad
    if factor == 1:
        return changed or ['no Resize in the test pipeline: native size']
    index = next((i + 1 for i, t in enumerate(pipeline)
                  if isinstance(t, dict) and 'Load' in _type_name(t)
                  and 'Image' in _type_name(t)), 0)
    pipeline.insert(
        index, dict(type='Resize', scale_factor=factor, keep_ratio=True))
    return [f'inserted Resize(scale_factor={factor:g}) at position {index}'
            ] + changed


def dataset_pipelines(cfg: Config) -> List[List[dict]]:
    """Every ``pipeline`` of the test data set config, looking through
    wrappers (``dataset``) and ``ConcatDataset`` (``datasets``).

    Raises:
        ValueError: If the config has no ``test_dataloader.dataset`` or no
            pipeline in it.
    """
    loader = cfg.get('test_dataloader')
    if not loader or not loader.get('dataset'):
        raise ValueError(
            f'test_dataloader must have a dataset to evaluate on, got '
            f'test_dataloader={loader!r}; valid: a dict with '
            '`dataset=dict(..., pipeline=[...])`')
    pipelines, todo = [], [loader['dataset']]
    while todo:
        dataset = todo.pop(0)
        if isinstance(dataset.get('pipeline'), list):
            pipelines.append(dataset['pipeline'])
        if dataset.get('dataset'):
            todo.append(dataset['dataset'])
        todo += list(dataset.get('datasets') or [])
    if not pipelines:
        raise ValueError(
            f'test_dataloader.dataset has no `pipeline` (type '
            f"{loader['dataset'].get('type')!r}, wrappers looked through: "
            "'dataset', 'datasets')")
    return pipelines


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


def scale_config(cfg: Config,
                 factor: float,
                 checkpoint: str,
                 work_dir: str,
                 tag: str = 'scale') -> tuple:
    """A copy of ``cfg`` that tests ``checkpoint`` at ``factor``.

    Args:
        tag (str): The run's folder and name say ``<tag>_<factor>``.

    Returns:
        tuple[Config, list[str]]: The config and the resize changes.
    """
    from mmpe.utils import fix_worker_settings

    run_cfg = copy.deepcopy(cfg)
    changed = []
    for pipeline in dataset_pipelines(run_cfg):
        changed += rescale_or_insert(pipeline, factor)
    run_cfg.load_from = checkpoint
    run_cfg.resume = False
    run_cfg.work_dir = osp.join(work_dir, f'{tag}_{factor:g}')
    run_cfg.launcher = 'none'
    # one logger, message hub and visualizer per scale: mmengine reuses
    # instances by name, which would send a scale's logs to another's dir
    # (mmdet's default_runtime names the visualizer 'visualizer'); unnamed,
    # they take the Runner's '<experiment_name>_<timestamp>'
    name = osp.splitext(osp.basename(cfg.filename or 'config'))[0]
    run_cfg.experiment_name = f'{name}_{tag}_{factor:g}'
    if isinstance(run_cfg.get('visualizer'), dict):
        run_cfg.visualizer.pop('name', None)
    fix_worker_settings(run_cfg)
    return run_cfg, changed


def _test_datasets(cfg: Config) -> List[dict]:
    """Every dataset config of the test loader (wrappers looked through)."""
    found, todo = [], [cfg.test_dataloader.dataset]
    while todo:
        dataset = todo.pop(0)
        found.append(dataset)
        if dataset.get('dataset'):
            todo.append(dataset['dataset'])
        todo += list(dataset.get('datasets') or [])
    return found


def test_data_root(cfg: Config) -> str:
    """The test set's ``data_root`` (one for all its datasets).

    Raises:
        ValueError: None or several.
    """
    roots = {d['data_root'] for d in _test_datasets(cfg) if d.get('data_root')}
    if len(roots) != 1:
        raise ValueError(
            f'the canvas test needs one `data_root` in test_dataloader.dataset'
            f', got {sorted(roots)}')
    return roots.pop()


def canvas_data(cfg: Config, factor: float) -> str:
    """Write (or find) the canvas test set of ``cfg``'s embedded test set.

    The generator's parameters come from the test set's meta file; the
    canvas set has its validation split only, drawn with the same seed and
    ``canvas=factor``, in ``<data_root>_canvas<factor>/``.

    Returns:
        str: The canvas set's data root (with a trailing ``/``).

    Raises:
        ValueError: When the test set was not made by mmpe's generator (or
            by another version of it, or is itself a canvas set).
        FileExistsError: When the canvas folder holds other data.
    """
    from mmpe.datasets import SyntheticImageParams, generate_synthetic_coco
    from mmpe.datasets.synthetic_coco import GENERATOR_VERSION, META_FILE

    root = test_data_root(cfg)
    meta_file = osp.join(root, 'annotations', META_FILE)
    if not osp.isfile(meta_file):
        raise ValueError(
            f'--canvas redraws the test set with mmpe\'s embedded data '
            f'generator, but {meta_file} (its record of the parameters) '
            'does not exist; make the data with '
            'tools/dataset_converters/make_synthetic_coco.py')
    with open(meta_file) as f:
        params = json.load(f)['params']
    if params.get('generator_version') != GENERATOR_VERSION:
        raise ValueError(
            f'{meta_file}: generator version '
            f"{params.get('generator_version')!r}, this code draws version "
            f'{GENERATOR_VERSION}; remake the data set first')
    if params.get('canvas', 1) != 1:
        raise ValueError(f'{meta_file}: the test set is already a canvas set '
                         f"(canvas={params['canvas']})")
    fields = SyntheticImageParams.__dataclass_fields__
    image = {k: tuple(v) if isinstance(v, list) else v
             for k, v in params.items() if k in fields}
    out = f"{root.rstrip('/')}_canvas{factor:g}"
    generate_synthetic_coco(
        out,
        num_train=0,
        num_val=params['num_val'],
        seed=params['seed'],
        img_format=params['img_format'],
        **dict(image, canvas=factor))
    return out + '/'


def canvas_config(cfg: Config, factor: float, checkpoint: str,
                  work_dir: str, canvas_root: str) -> tuple:
    """:func:`scale_config` at ``factor`` on the canvas set.

    The resize sizes grow by ``factor`` as the images do, so each canvas
    image is resized by the factor of an image of its base size: objects
    keep the scale of the ``x1`` test. The test datasets' ``data_root``
    and the evaluator's annotation file move to ``canvas_root``.

    Returns:
        tuple[Config, list[str]]: The config and what changed.
    """
    run_cfg, changed = scale_config(cfg, factor, checkpoint, work_dir,
                                    tag='canvas')
    root = test_data_root(run_cfg)
    for dataset in _test_datasets(run_cfg):
        if dataset.get('data_root') == root:
            dataset['data_root'] = canvas_root
    evaluators = run_cfg.get('test_evaluator')
    for evaluator in (evaluators if isinstance(evaluators, list) else
                      [evaluators]):
        ann_file = (evaluator or {}).get('ann_file')
        if isinstance(ann_file, str) and ann_file.startswith(root):
            evaluator['ann_file'] = canvas_root + ann_file[len(root):]
    return run_cfg, changed + [f'data_root: {root} -> {canvas_root}']


def evaluate(run_cfg: Config) -> tuple:
    """``Runner.test()`` with weights-only checkpoint loading.

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
    with safe_checkpoint_loading():
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
    import mmpe  # noqa: F401  (registers mmpe modules)
    from mmpe.engine import UNSAFE_LOAD_ENV
    from mmpe.utils import DataNotFoundError, check_data_paths

    if args.allow_unsafe_checkpoint:
        os.environ[UNSAFE_LOAD_ENV] = '1'
    if not osp.isfile(args.checkpoint):
        print(f'error: checkpoint {args.checkpoint!r} does not exist',
              file=sys.stderr)
        return 2
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    try:
        dataset_pipelines(cfg)
        check_data_paths(cfg, ('test', ))
        canvas_roots = [canvas_data(cfg, c) for c in args.canvas]
    except (ValueError, DataNotFoundError, FileExistsError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    work_dir = args.work_dir or osp.join(
        cfg.get('work_dir') or osp.join(
            './work_dirs',
            osp.splitext(osp.basename(args.config))[0]), 'eval_resolutions')
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
        metrics, images = evaluate(run_cfg)
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
