"""Check a COCO-format annotation file the way mmdet's ``CocoDataset`` reads
it, before mmdet silently drops what it cannot use.

``CocoDataset.parse_data_info`` skips an annotation whose box lies outside
the image, has an area <= 0 or a side below a pixel, or whose category is
not among the config's classes, and ``filter_empty_gt`` then drops images
left without annotations: a wrong file trains a model on less than the user
thinks, without a word. :func:`check_coco` reads the raw records and reports,
per annotation (with its id):

* a box that is not 4 finite numbers, has zero or negative width or height,
  or reaches outside its image by more than a pixel (COCO boxes are
  ``[x, y, w, h]`` in pixel-edge coordinates, so ``0 <= x`` and
  ``x + w <= width`` for a box inside);
* an ``area`` that is not finite or is <= 0;
* a category id the file does not define (one it defines but the config's
  classes leave out is mmdet's documented way to train on some classes: it
  is counted in a note, not reported);
* a polygon with fewer than 3 points, an odd number of coordinates or
  values that are not finite; an RLE mask whose size is not the image's or
  whose run lengths do not cover it exactly (checked before pycocotools
  decodes it: its decoder writes past the mask otherwise);

(masks only when the pipeline loads them) and per image, a ``width`` /
``height`` that is not a positive number; for
the whole file, a class of the config that the file does not define (mmdet
numbers the labels by the classes it finds, so every later class would get
the wrong label).
"""
import math
import os.path as osp
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

from .problems import Problem

#: How far (pixels) a box may reach outside its image: rounding of
#: annotation tools.
BOX_TOLERANCE_PX = 1.0


#: The types a number has in a loaded JSON file.
_JSON_NUMBERS = frozenset((int, float))


def _finite_numbers(values) -> bool:
    """Whether ``values`` is a list of finite ints / floats (not bools,
    None or strings). COCO's polygons hold tens of millions of coordinates:
    ``map`` keeps the loop in C."""
    if not isinstance(values, (list, tuple)):
        return False
    if not set(map(type, values)) <= _JSON_NUMBERS:
        return False
    try:
        return all(map(math.isfinite, values))
    except OverflowError:  # an int beyond float's range
        return False


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(
        value, bool) and math.isfinite(value) and value > 0


def _box_reason(bbox, width, height) -> Optional[Tuple[str, str]]:
    if not (isinstance(bbox, (list, tuple)) and len(bbox) == 4):
        return 'bad box', f'bbox {bbox!r} is not [x, y, w, h]'
    if not _finite_numbers(bbox):
        return 'NaN or inf', f'bbox {list(bbox)} has values that are not ' \
            'finite numbers'
    x, y, w, h = bbox
    if w <= 0 or h <= 0:
        return 'zero-size box', f'box {list(bbox)} (x, y, w, h) has zero ' \
            'or negative width or height'
    tol = BOX_TOLERANCE_PX
    if _positive(width) and _positive(height) and (
            x < -tol or y < -tol or x + w > width + tol
            or y + h > height + tol):
        return 'box outside the image', f'box {list(bbox)} (x, y, w, h) ' \
            f'reaches outside the {width} x {height} image by more than ' \
            f'{tol:g} pixel'
    return None


def _segmentation_reasons(seg, width, height) -> List[Tuple[str, str]]:
    reasons = []
    if isinstance(seg, list):
        for k, poly in enumerate(seg):
            if not isinstance(poly, (list, tuple)):
                reasons.append(('bad polygon',
                                f'polygon {k} is not a list of numbers'))
            elif not _finite_numbers(poly):
                reasons.append(('NaN or inf', f'polygon {k} has values that '
                                'are not finite numbers'))
            elif len(poly) % 2:
                reasons.append(('bad polygon', f'polygon {k} has an odd '
                                f'number of coordinates ({len(poly)})'))
            elif len(poly) < 6:
                reasons.append(('polygon with fewer than 3 points',
                                f'polygon {k} has {len(poly) // 2} point(s); '
                                'a polygon needs at least 3'))
    elif isinstance(seg, dict):
        reason = _rle_reason(seg, width, height)
        if reason:
            reasons.append(('bad RLE mask', reason))
    elif seg is not None:
        reasons.append(('bad segmentation',
                        f'segmentation of type {type(seg).__name__} is '
                        'neither polygons nor an RLE mask'))
    return reasons


def rle_counts(counts: str) -> List[int]:
    """The run lengths of a compressed COCO RLE string (pycocotools'
    ``rleFrString``: 5 bits a character from ``'0'`` on, a continuation
    bit, a sign bit; from the fourth count on, each is stored as its
    difference to the count two before). Negative values are returned as
    they are, for the caller to refuse."""
    values, i = [], 0
    while i < len(counts):
        x, k, more = 0, 0, True
        while more:
            if i >= len(counts):
                raise ValueError('the string ends inside a count')
            c = ord(counts[i]) - 48
            x |= (c & 0x1f) << (5 * k)
            more = bool(c & 0x20)
            i, k = i + 1, k + 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(values) > 2:
            x += values[-2]
        values.append(x)
    return values


def _rle_reason(rle: dict, width, height) -> Optional[str]:
    """Why an RLE mask does not decode to the image's size, or None.

    The run lengths are checked before pycocotools decodes them: its
    ``rleDecode`` writes as many pixels as the counts say, past the end of
    the mask when they add up to more.
    """
    from pycocotools import mask as mask_utils
    size = rle.get('size')
    if not (_positive(width) and _positive(height)):
        return None  # the image record is reported
    if list(size or []) != [height, width]:
        return f'RLE size {size} is not the image\'s [h, w] = ' \
            f'[{height}, {width}]'
    counts = rle.get('counts')
    try:
        runs = rle_counts(counts) if isinstance(counts, str) else counts
        if not (isinstance(runs, list) and all(
                isinstance(v, int) and v >= 0 for v in runs)):
            return 'RLE counts are not non-negative integers'
        if sum(runs) != height * width:
            return f'RLE counts cover {sum(runs)} pixels, not the ' \
                f'{width} x {height} = {width * height} of the image'
        if isinstance(counts, list):  # uncompressed
            rle = mask_utils.frPyObjects(rle, height, width)
        mask_utils.decode(rle)
    except Exception as err:  # noqa: BLE001  (any failure: undecodable)
        return f'RLE mask does not decode ({type(err).__name__}: {err})'
    return None


def check_coco(coco: dict, ann_file: str, classes: Sequence[str],
               img_prefix: str, index_of: Dict[object, int],
               with_masks: bool = True
               ) -> Tuple[List[dict], List[Problem], List[str]]:
    """Check a loaded COCO annotation file.

    Args:
        coco (dict): The file's JSON (``images``, ``annotations``,
            ``categories``).
        ann_file (str): Its path, for the messages.
        classes (Sequence[str]): The config's classes (``metainfo``).
        img_prefix (str): The data set's image folder (``data_prefix``).
        index_of (dict): Image id -> data set index, for the images the data
            set uses.
        with_masks (bool): Check ``segmentation`` too (the pipeline loads
            masks: instance segmentation). Defaults to True.

    Returns:
        tuple: The images (dicts of ``img_id``, ``path``, ``width``,
        ``height``, ``index``), the problems and notes for the summary.
    """
    problems, notes = [], []
    cats = {c.get('id'): c.get('name') for c in coco.get('categories', [])}
    missing = [c for c in classes if c not in cats.values()]
    if missing:
        problems.append(Problem(
            ann_file, f'class(es) {missing} of the config are not among the '
            f'file\'s categories {sorted(map(str, cats.values()))}; mmdet '
            'would give the classes after them the wrong labels',
            'class missing from the annotation file', whole_set=True))
    used = {cid for cid, name in cats.items() if name in classes}

    images, records = [], {}
    for img in coco.get('images', []):
        img_id = img.get('id')
        path = osp.join(img_prefix, str(img.get('file_name')))
        width, height = img.get('width'), img.get('height')
        record = dict(img_id=img_id, path=path, width=width, height=height,
                      index=index_of.get(img_id))
        records[img_id] = record
        images.append(record)
        if not (_positive(width) and _positive(height)):
            problems.append(Problem(
                path, f'the annotation file gives it width {width!r} and '
                f'height {height!r}; both must be positive numbers',
                'bad image size in the annotations',
                index=record['index'], img_id=img_id))

    left_out = defaultdict(int)
    for ann in coco.get('annotations', []):
        record = records.get(ann.get('image_id'))
        if record is None:
            continue  # mmdet never reads it
        width, height = record['width'], record['height']
        reasons = []
        box = _box_reason(ann.get('bbox'), width, height)
        if box:
            reasons.append(box)
        area = ann.get('area')
        if area is not None and not _finite_numbers([area]):
            reasons.append(('NaN or inf', f'area {area!r} is not a finite '
                            'number'))
        elif area is not None and area <= 0 and not box:
            reasons.append(('zero-size box', f'area {area} (mmdet drops '
                            'annotations of area <= 0)'))
        cid = ann.get('category_id')
        if cid not in cats:
            reasons.append(('unknown category', f'category id {cid!r} is '
                            'not among the file\'s categories '
                            f'{sorted(cats, key=str)}'))
        elif cid not in used:
            left_out[cats[cid]] += 1
        if with_masks:
            reasons += _segmentation_reasons(
                ann.get('segmentation'), width, height)
        for kind, reason in reasons:
            problems.append(Problem(record['path'], reason, kind,
                                    ann_id=ann.get('id'),
                                    index=record['index'],
                                    img_id=record['img_id']))
    if left_out:
        n = sum(left_out.values())
        notes.append(f'{n} annotation(s) of {len(left_out)} categor(y/ies) '
                     'the config\'s classes leave out are not used, as mmdet '
                     'does')
    return images, problems, notes
