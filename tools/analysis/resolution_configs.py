"""The test configs of ``eval_resolutions.py``: every pipeline of a
config's test set (wrappers and ``ConcatDataset`` looked through) with its
resize sizes scaled by a factor (a resize inserted where a pipeline has
none), and the config of one resized or canvas test run."""
import copy
import os.path as osp
from typing import List, Union

from mmengine.config import Config

from mmpe.utils import fix_worker_settings

#: Size fields of resize transforms, in pixels (rounded to int when int).
SIZE_KEYS = ('scale', 'scales', 'width', 'height', 'max_size')


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
