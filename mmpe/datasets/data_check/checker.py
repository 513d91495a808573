"""Check every file and annotation a data set will read, before training.

:func:`check_dataset` takes a built data set (mmdet's or mmseg's) and
returns every problem at once (:class:`CheckResult`):

* each image file is read and decoded as the pipeline's
  ``LoadImageFromFile`` reads it (:mod:`.image_files`), and its decoded size
  is compared with the annotation's ``width`` / ``height``;
* COCO-format detection and instance segmentation sets: the raw annotation
  file (:mod:`.coco_annotations`: boxes, areas, categories, polygons, RLE
  masks, NaN / inf), every image the file lists, also those the data set
  leaves out; other detection sets: the boxes and labels of their parsed
  samples;
* semantic segmentation sets: each label map (:mod:`.label_maps`): its size
  is its image's, its values are classes or the ignore index.

Reading files is what takes time; it runs in ``num_workers`` processes on
each rank of a distributed run (:mod:`.file_reads`): rank 0 decides what to
read and assembles the result; the others return None. The results are
cached per file (:mod:`.file_cache`) and so is the annotation file's check,
so a second start reads only what changed.
"""
import json
import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mmengine.dist import get_dist_info

from .coco_annotations import check_coco
from .file_cache import FileCheckCache, default_cache_dir, file_stamp
from .file_reads import read_on_all_ranks
from .image_files import ImageReadSettings, loads_masks
from .label_maps import LABEL_MAP_KEY, label_size_reason, label_value_reason
from .problems import Problem

#: ``cache_dir`` value that means the default (``default_cache_dir()``).
DEFAULT_CACHE = 'default'


@dataclass
class CheckOptions:
    """How :func:`check_dataset` runs.

    Attributes:
        num_workers (int): Processes reading files (0: this process).
        cache_dir (str | None): Where results are kept between runs;
            :data:`DEFAULT_CACHE` for :func:`~.file_cache.default_cache_dir`,
            None to keep nothing.
        ignore_index (int): The label value segmentation losses ignore.
        progress (bool): Show a progress bar (rank 0, many files).
    """

    num_workers: int = 0
    cache_dir: Optional[str] = DEFAULT_CACHE
    ignore_index: int = 255
    progress: bool = True


@dataclass
class CheckResult:
    """What :func:`check_dataset` found in one data set.

    Attributes:
        name (str): E.g. ``'train set'``.
        source (str): Its annotation file or image folder.
        num_samples (int): Samples of the data set.
        num_files (int): Files checked (images and label maps).
        num_read (int): Files read now (the others came from the cache).
        seconds (float): Time spent reading files.
        total_seconds (float): Time of the whole check (also reading the
            annotation file and the cache).
        problems (list[Problem]): Everything wrong, all at once.
        notes (list[str]): Facts worth a line that are not problems.
        wrapped (bool): The data set wraps others (e.g. ``RepeatDataset``):
            problems name no index of it.
    """

    name: str
    source: str
    num_samples: int = 0
    num_files: int = 0
    num_read: int = 0
    seconds: float = 0.0
    total_seconds: float = 0.0
    problems: List[Problem] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    wrapped: bool = False

    def bad_indices(self) -> List[int]:
        """Data set indices of the samples with a problem."""
        return sorted({p.index for p in self.problems if p.index is not None})

    def bad_files(self) -> List[str]:
        """The files of those samples, each once, in order."""
        return list(dict.fromkeys(p.file for p in self.problems
                                  if p.index is not None))

    def summary(self) -> str:
        """One line: what was checked, how fast, how much from the cache."""
        rate = self.num_read / self.seconds if self.seconds > 0 else 0.0
        return (f'{self.name} ({self.num_samples} samples, {self.num_files} '
                f'files: {self.num_read} read in {self.seconds:.1f} s '
                f'({rate:.0f} files/s), '
                f'{self.num_files - self.num_read} unchanged since the last '
                f'check; {self.total_seconds:.1f} s in all)')


@dataclass
class _Unit:
    """One image the data set reads (and its label map)."""

    path: str
    index: Optional[int]
    settings: ImageReadSettings
    expected: Optional[List[int]] = None  # [h, w] from the annotation
    seg: Optional[dict] = None
    img_id: Optional[object] = None  # COCO: index filled in from it


def _leaves(dataset) -> list:
    """The data sets inside wrappers (Concat, Repeat, ClassBalanced...)."""
    if hasattr(dataset, 'datasets'):
        return [d for sub in dataset.datasets for d in _leaves(sub)]
    if hasattr(dataset, 'dataset'):
        return _leaves(dataset.dataset)
    return [dataset]


def _infos(dataset) -> List[dict]:
    # get_data_info: data_list is emptied when serialize_data=True
    return [dataset.get_data_info(i) for i in range(len(dataset))]


def _is_coco(dataset) -> bool:
    from mmdet.datasets import CocoDataset
    return isinstance(dataset, CocoDataset) and str(
        getattr(dataset, 'ann_file', '')).endswith('.json')


def _source(dataset) -> str:
    ann = getattr(dataset, 'ann_file', '') or ''
    if ann:
        return ann
    prefix = getattr(dataset, 'data_prefix', {}) or {}
    return next(iter(prefix.values()), '') or getattr(dataset, 'data_root',
                                                      '') or '.'


def _coco_units(dataset, cache: FileCheckCache, settings: ImageReadSettings
                ) -> Tuple[List[_Unit], List[Problem], List[str]]:
    """Every image of a COCO annotation file and the file's problems; the
    data set indices are filled in later, only if there are problems."""
    classes = list(dataset.metainfo.get('classes') or [])
    ann_file = dataset.ann_file
    with_masks = loads_masks(getattr(dataset, 'pipeline', None))
    stamp = [*(file_stamp(ann_file) or (None, None)), classes,
             dataset.data_prefix.get('img', ''), with_masks]
    cached = cache.section('coco', stamp) if stamp[0] is not None else None
    if cached is None:
        with open(ann_file) as f:
            coco = json.load(f)
        images, problems, notes = check_coco(
            coco, ann_file, classes, dataset.data_prefix.get('img', ''), {},
            with_masks)
        del coco
        cached = dict(images=images, notes=notes,
                      problems=[p.to_dict() for p in problems])
        if stamp[0] is not None:
            cache.put_section('coco', stamp, cached)
    units = []
    for img in cached['images']:
        expected = [img['height'], img['width']] if all(
            isinstance(v, (int, float)) and v > 0
            for v in (img['width'], img['height'])) else None
        units.append(_Unit(img['path'], None, settings, expected,
                           img_id=img['img_id']))
    return units, [Problem(**d) for d in cached['problems']], list(
        cached['notes'])


def _fill_coco_indices(dataset, problems: List[Problem]) -> None:
    """Set ``index`` of the problems of a COCO data set from their image
    ids (images the data set leaves out keep None)."""
    index_of = {
        dataset.get_data_info(i)['img_id']: i
        for i in range(len(dataset))
    }
    for p in problems:
        if p.img_id is not None:
            p.index = index_of.get(p.img_id)


def _detection_problems(info: dict, index: Optional[int],
                        num_classes: int) -> List[Problem]:
    """Boxes and labels of a parsed (non-COCO) detection sample."""
    problems = []
    width, height = info.get('width'), info.get('height')
    for k, inst in enumerate(info.get('instances', [])):
        box = list(inst.get('bbox', []))
        label = inst.get('bbox_label')
        if len(box) != 4 or not all(math.isfinite(v) for v in box):
            problems.append(Problem(info['img_path'], f'box {box} is not 4 '
                                    'finite numbers', 'NaN or inf', k, index))
            continue
        x1, y1, x2, y2 = box
        if x2 <= x1 or y2 <= y1:
            problems.append(Problem(info['img_path'], f'box {box} (x1, y1, '
                                    'x2, y2) has zero or negative width or '
                                    'height', 'zero-size box', k, index))
        elif width and height and (x1 < -1 or y1 < -1 or x2 > width + 1
                                   or y2 > height + 1):
            problems.append(Problem(
                info['img_path'], f'box {box} (x1, y1, x2, y2) reaches '
                f'outside the {width} x {height} image by more than 1 pixel',
                'box outside the image', k, index))
        if not (isinstance(label, int) and 0 <= label < num_classes):
            problems.append(Problem(info['img_path'], f'label {label!r} is '
                                    f'not a class index 0..{num_classes - 1}',
                                    'unknown category', k, index))
    return problems


def _describe(dataset, indexed: bool, cache: FileCheckCache
              ) -> Tuple[List[_Unit], List[Problem], List[str]]:
    """The images (and label maps) to read and the problems found without
    reading them."""
    settings = ImageReadSettings.from_pipeline(getattr(dataset, 'pipeline',
                                                       None))
    notes = [] if settings.found else [
        'the pipeline has no LoadImageFromFile: images are decoded with '
        "mmcv's defaults (cv2, color)"
    ]
    if _is_coco(dataset):
        units, problems, more = _coco_units(dataset, cache, settings)
        return units, problems, notes + more
    classes = dataset.metainfo.get('classes') or ()
    units, problems = [], []
    for i, info in enumerate(_infos(dataset)):
        index = i if indexed else None
        if 'instances' in info:
            problems += _detection_problems(info, index, len(classes))
        seg = None
        if info.get('seg_map_path') and 'instances' not in info:
            if not classes:
                problems.append(Problem(
                    _source(dataset), f'{type(dataset).__name__} names no '
                    'classes (metainfo `classes`)', 'no classes',
                    whole_set=True))
                return [], problems, notes
            seg = dict(path=info['seg_map_path'], num_classes=len(classes),
                       reduce_zero_label=bool(
                           info.get('reduce_zero_label', False)),
                       label_map=info.get('label_map'))
        expected = None
        if info.get('width') and info.get('height'):
            expected = [info['height'], info['width']]
        units.append(_Unit(info['img_path'], index, settings, expected, seg))
    return units, problems, notes


def _unit_problems(unit: _Unit, results: Dict[Tuple[str, str], dict],
                   ignore_index: int) -> List[Problem]:
    image = results[(unit.path, unit.settings.key())]
    problems = []
    if 'kind' in image:
        problems.append(Problem(unit.path, image['reason'], image['kind'],
                                index=unit.index, img_id=unit.img_id))
    elif unit.expected is not None and image['shape'] != unit.expected:
        (h, w), (eh, ew) = image['shape'], unit.expected
        turned = ' (turned by its EXIF orientation?)' if [w, h] == [eh, ew] \
            else ''
        problems.append(Problem(
            unit.path, f'decoded size {w} x {h} (w x h) differs from the '
            f"annotation's {ew} x {eh}{turned}",
            'size differs from the annotation', index=unit.index,
            img_id=unit.img_id))
    if unit.seg is None:
        return problems
    seg = unit.seg
    label = results[(seg['path'], LABEL_MAP_KEY)]
    if 'kind' in label:
        problems.append(Problem(seg['path'], f'{label["reason"]} (image '
                                f'{unit.path})', label['kind'],
                                index=unit.index))
        return problems
    if 'shape' in image:
        reason = label_size_reason(label['shape'], unit.path, image['shape'])
        if reason:
            problems.append(Problem(seg['path'], reason,
                                    'label map size differs from its image',
                                    index=unit.index))
    reason = label_value_reason(label['values'], seg['num_classes'],
                                ignore_index, seg['reduce_zero_label'],
                                seg['label_map'])
    if reason:
        problems.append(Problem(seg['path'], reason, 'label value',
                                index=unit.index))
    return problems


def check_dataset(dataset, name: str,
                  options: CheckOptions) -> Optional[CheckResult]:
    """Check a built data set (see the module docstring).

    Every rank of a distributed run must call it (they share the reading).

    Args:
        dataset: An mmengine ``BaseDataset`` (or a wrapper of some).
        name (str): How the report calls it, e.g. ``'train set'``.
        options (CheckOptions): Workers, cache, ignore index, progress bar.

    Returns:
        CheckResult | None: On rank 0 the result; None on other ranks.
    """
    rank, _ = get_dist_info()
    started = time.perf_counter()  # reported, never compared
    todo, plan = [], None
    if rank == 0:
        leaves = _leaves(dataset)
        wrapped = leaves != [dataset]
        source = _source(leaves[0])
        cache_dir = default_cache_dir() if \
            options.cache_dir == DEFAULT_CACHE else options.cache_dir
        cache = FileCheckCache(cache_dir, source)
        units, problems, notes = [], [], []
        for leaf in leaves:
            u, p, n = _describe(leaf, not wrapped, cache)
            units, problems, notes = units + u, problems + p, notes + n
        if cache.warning:
            notes.append(cache.warning)
        tasks = {}  # (path, key) -> task, each file once
        for unit in units:
            tasks[(unit.path, unit.settings.key())] = (unit.path,
                                                       unit.settings)
            if unit.seg is not None:
                tasks[(unit.seg['path'], LABEL_MAP_KEY)] = (unit.seg['path'],
                                                            None)
        results = {}
        for key, task in tasks.items():
            hit = cache.get(task[0], key[1])
            if hit is not None:
                results[key] = hit
            else:
                todo.append((key, task))
        plan = (cache, source, units, problems, notes, results, tasks,
                wrapped)
    todo, read, seconds = read_on_all_ranks(todo, options.num_workers,
                                            options.progress)
    if rank != 0:
        return None
    cache, source, units, problems, notes, results, tasks, wrapped = plan
    for key, result in read:
        results[tuple(key)] = result
        cache.put(key[0], key[1], result)
    warning = cache.save(source) if todo else None
    if warning:
        notes.append(warning)
    for unit in units:
        problems += _unit_problems(unit, results, options.ignore_index)
    if problems and not wrapped and _is_coco(dataset):
        _fill_coco_indices(dataset, problems)
    problems.sort(key=lambda p: (not p.whole_set, p.file, str(p.ann_id)))
    return CheckResult(
        name=name, source=source, num_samples=len(dataset),
        num_files=len(tasks), num_read=len(todo), seconds=seconds,
        total_seconds=time.perf_counter() - started, problems=problems,
        notes=notes, wrapped=wrapped)

