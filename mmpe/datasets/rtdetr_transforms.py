"""The two RT-DETR training transforms that mmdet computes differently.

The RT-DETR authors train with torchvision's v2 transforms on PIL images
(lyuwenyu/RT-DETR, ``rtdetrv2_pytorch/src/data/transforms/_transforms.py``,
``configs/rtdetrv2/include/dataloader.yml``). Two of them have mmdet
counterparts that compute something else, so they are here, on mmdet's
result dicts (BGR ``uint8`` images, ``gt_bboxes`` in pixels):

- :class:`RandomPhotometricDistort` (torchvision's, ``p=0.5``): each of
  brightness x U(0.875, 1.125), contrast U(0.5, 1.5), saturation
  U(0.5, 1.5) and hue U(-0.05, 0.05) of a turn with probability ``p``,
  contrast before or after saturation and hue with probability 0.5, then
  a channel permutation with probability ``p``; each step is PIL's
  (``ImageEnhance`` blends with black, the grey mean and the grey image;
  the hue a shift of PIL's 8-bit HSV hue), rounding to 8 bits after each,
  as torchvision does on PIL images. mmdet's ``PhotoMetricDistortion``
  adds a brightness delta, scales contrast about 0, scales HSV saturation
  and keeps float values unclipped.
- :class:`RandomIoUCrop` (torchvision's, with the authors' ``p``): a
  minimum IoU drawn from (0, 0.1, 0.3, 0.5, 0.7, 0.9, 1; 1: no crop), then
  up to 40 trials of a crop of 0.3-1 of each side, aspect 0.5-2, accepted
  when some box has its centre strictly inside and the largest IoU of
  those boxes with the crop reaches the minimum; the boxes whose centres
  are outside are dropped, the others clipped. mmdet's
  ``MinIoURandomCrop`` asks the *smallest* IoU of *all* boxes to reach the
  minimum, draws 50 trials and continuous sizes.

The random draws use torch's default generator, in torchvision's order.
"""
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
from mmcv.transforms import BaseTransform
from PIL import Image, ImageEnhance

from mmdet.registry import TRANSFORMS

#: torchvision's RandomIoUCrop options (``sampler_options``)
IOU_OPTIONS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)


def _check_prob(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(
            value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f'Unsupported `{name}` {value!r}, please give a '
                         'probability in [0, 1]')
    return float(value)


def _check_range(name: str, value, low: float = 0.) -> Tuple[float, float]:
    ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool)
        for v in value) and low <= value[0] <= value[1]
    if not ok:
        raise ValueError(f'Unsupported `{name}` {value!r}, please give '
                         f'(low, high) with {low} <= low <= high')
    return float(value[0]), float(value[1])


def _uniform(low: float, high: float) -> float:
    return float(torch.empty(1).uniform_(low, high))


def adjust_hue_pil(image: Image.Image, hue_factor: float) -> Image.Image:
    """torchvision's ``adjust_hue`` of a PIL RGB image: PIL's 8-bit HSV hue
    shifted by ``int(hue_factor * 255)`` modulo 256."""
    h, s, v = image.convert('HSV').split()
    shift = int(hue_factor * 255) % 256  # toward zero, then wrapped
    hue = ((np.asarray(h, dtype=np.int64) + shift) % 256).astype(np.uint8)
    return Image.merge('HSV', (Image.fromarray(hue, 'L'), s,
                               v)).convert('RGB')


@TRANSFORMS.register_module()
class RandomPhotometricDistort(BaseTransform):
    """torchvision's ``RandomPhotometricDistort`` on PIL images (module
    docstring), for mmdet's BGR ``uint8`` images.

    Required / modified keys: ``img`` (``uint8``, stays ``uint8``).

    Args:
        brightness (tuple[float, float]): Factor range. Defaults to
            (0.875, 1.125).
        contrast (tuple[float, float]): Defaults to (0.5, 1.5).
        saturation (tuple[float, float]): Defaults to (0.5, 1.5).
        hue (tuple[float, float]): In turns, within [-0.5, 0.5]. Defaults
            to (-0.05, 0.05).
        p (float): Probability of each step (and of the permutation).
            Defaults to 0.5.
    """

    def __init__(self,
                 brightness: Sequence[float] = (0.875, 1.125),
                 contrast: Sequence[float] = (0.5, 1.5),
                 saturation: Sequence[float] = (0.5, 1.5),
                 hue: Sequence[float] = (-0.05, 0.05),
                 p: float = 0.5) -> None:
        self.brightness = _check_range('brightness', brightness)
        self.contrast = _check_range('contrast', contrast)
        self.saturation = _check_range('saturation', saturation)
        self.hue = _check_range('hue', hue, low=-0.5)
        if self.hue[1] > 0.5:
            raise ValueError(f'Unsupported `hue` {hue!r}, please give '
                             '(low, high) within [-0.5, 0.5]')
        self.p = _check_prob('p', p)

    def draw(self) -> dict:
        """The factors (None: step skipped), ``contrast_before`` and the
        channel permutation, drawn as torchvision draws them."""
        params = {}
        for key in ('brightness', 'contrast', 'saturation', 'hue'):
            low, high = getattr(self, key)
            params[key] = _uniform(low, high) if float(
                torch.rand(1)) < self.p else None
        params['contrast_before'] = bool(torch.rand(()) < 0.5)
        params['permutation'] = torch.randperm(3).tolist() if float(
            torch.rand(1)) < self.p else None
        return params

    @staticmethod
    def apply(rgb: Image.Image, params: dict) -> Image.Image:
        """The steps on a PIL RGB image."""
        if params['brightness'] is not None:
            rgb = ImageEnhance.Brightness(rgb).enhance(params['brightness'])
        contrast = params['contrast']
        if contrast is not None and params['contrast_before']:
            rgb = ImageEnhance.Contrast(rgb).enhance(contrast)
        if params['saturation'] is not None:
            rgb = ImageEnhance.Color(rgb).enhance(params['saturation'])
        if params['hue'] is not None:
            rgb = adjust_hue_pil(rgb, params['hue'])
        if contrast is not None and not params['contrast_before']:
            rgb = ImageEnhance.Contrast(rgb).enhance(contrast)
        if params['permutation'] is not None:
            rgb = Image.fromarray(np.asarray(rgb)[..., params['permutation']])
        return rgb

    def transform(self, results: dict) -> dict:
        img = results['img']
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            raise ValueError(
                'RandomPhotometricDistort takes 8-bit 3-channel images (the '
                f'authors\' PIL images), got {img.dtype} {img.shape}; put it '
                'before any transform that makes floats')
        rgb = Image.fromarray(np.ascontiguousarray(img[..., ::-1]))  # BGR->RGB
        rgb = self.apply(rgb, self.draw())
        results['img'] = np.ascontiguousarray(np.asarray(rgb)[..., ::-1])
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(brightness={self.brightness}, '
                f'contrast={self.contrast}, saturation={self.saturation}, '
                f'hue={self.hue}, p={self.p})')


def box_iou(boxes: np.ndarray, box: np.ndarray) -> np.ndarray:
    """IoU of ``(N, 4)`` x1y1x2y2 boxes with one box ``(4,)``."""
    lt = np.maximum(boxes[:, :2], box[:2])
    rb = np.minimum(boxes[:, 2:], box[2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=1)
    area = (boxes[:, 2:] - boxes[:, :2]).prod(axis=1)
    return inter / (area + (box[2:] - box[:2]).prod() - inter)


@TRANSFORMS.register_module()
class RandomIoUCrop(BaseTransform):
    """torchvision's ``RandomIoUCrop`` with the RT-DETR authors' ``p``
    (module docstring).

    Required keys: ``img``, ``gt_bboxes``; modified: ``img``,
    ``img_shape``, ``gt_bboxes`` (clipped to the crop), and
    ``gt_bboxes_labels``, ``gt_ignore_flags``, ``gt_masks`` (kept for the
    boxes whose centres are inside).

    Args:
        min_scale (float): Smallest crop side, as a fraction. Defaults to
            0.3.
        max_scale (float): Defaults to 1.
        min_aspect_ratio (float): Of width / height. Defaults to 0.5.
        max_aspect_ratio (float): Defaults to 2.
        sampler_options (sequence[float], optional): Minimum IoUs (>= 1:
            no crop). Defaults to :data:`IOU_OPTIONS`.
        trials (int): Crops tried per drawn minimum. Defaults to 40.
        p (float): Probability of the transform (the authors': 0.8).
            Defaults to 1.
    """

    def __init__(self,
                 min_scale: float = 0.3,
                 max_scale: float = 1.,
                 min_aspect_ratio: float = 0.5,
                 max_aspect_ratio: float = 2.,
                 sampler_options: Optional[Sequence[float]] = None,
                 trials: int = 40,
                 p: float = 1.) -> None:
        self.min_scale, self.max_scale = _check_range(
            'min_scale / max_scale', (min_scale, max_scale))
        self.min_aspect_ratio, self.max_aspect_ratio = _check_range(
            'min_aspect_ratio / max_aspect_ratio',
            (min_aspect_ratio, max_aspect_ratio))
        options = IOU_OPTIONS if sampler_options is None else sampler_options
        if not options or not all(
                isinstance(o, (int, float)) and not isinstance(o, bool)
                for o in options):
            raise ValueError(f'Unsupported `sampler_options` {options!r}, '
                             'please give minimum IoUs (>= 1: no crop)')
        self.options = tuple(float(o) for o in options)
        if isinstance(trials, bool) or not isinstance(trials,
                                                      int) or trials < 1:
            raise ValueError(f'Unsupported `trials` {trials!r}, please give '
                             'an int > 0')
        self.trials = trials
        self.p = _check_prob('p', p)

    def draw(self,
             boxes: np.ndarray,
             height: int,
             width: int,
             counted: Optional[np.ndarray] = None
             ) -> Optional[Tuple[int, int, int, int, np.ndarray]]:
        """``(left, top, new_w, new_h, inside)`` as torchvision draws it,
        or None for no crop (``inside``: the boxes whose centres are
        strictly inside the crop). Only the ``counted`` boxes (default:
        all) decide whether a crop is taken: mmdet keeps COCO's crowd boxes
        as ignored ones, which the authors' data set drops before the
        transforms."""
        cx = (boxes[:, 0] + boxes[:, 2]) / 2
        cy = (boxes[:, 1] + boxes[:, 3]) / 2
        if counted is None:
            counted = np.ones(len(boxes), dtype=bool)
        while True:
            index = int(torch.randint(0, len(self.options), (1, )))
            min_iou = self.options[index]
            if min_iou >= 1.0:
                return None
            for _ in range(self.trials):
                r = self.min_scale + (self.max_scale -
                                      self.min_scale) * torch.rand(2)
                new_w, new_h = int(width * r[0]), int(height * r[1])
                if new_h == 0 or not (self.min_aspect_ratio <= new_w / new_h
                                      <= self.max_aspect_ratio):
                    continue
                r = torch.rand(2)
                left = int((width - new_w) * r[0])
                top = int((height - new_h) * r[1])
                right, bottom = left + new_w, top + new_h
                if left == right or top == bottom:
                    continue
                inside = (left < cx) & (cx < right) & (top < cy) & (
                    cy < bottom)
                if not (inside & counted).any():
                    continue
                ious = box_iou(boxes[inside & counted],
                               np.array([left, top, right, bottom],
                                        dtype=np.float64))
                if ious.max() < min_iou:
                    continue
                return left, top, new_w, new_h, inside

    def transform(self, results: dict) -> dict:
        if float(torch.rand(1)) >= self.p:
            return results
        img = results['img']
        height, width = img.shape[:2]
        gt = results['gt_bboxes']
        boxes = gt.numpy().astype(np.float64) if hasattr(
            gt, 'numpy') else np.asarray(gt, dtype=np.float64)
        ignored = results.get('gt_ignore_flags')
        counted = None if ignored is None else ~np.asarray(ignored, bool)
        crop = self.draw(boxes.reshape(-1, 4), height, width, counted)
        if crop is None:
            return results
        left, top, new_w, new_h, inside = crop
        results['img'] = img[top:top + new_h, left:left + new_w]
        results['img_shape'] = results['img'].shape[:2]
        # (x, y) -> (x - left, y - top), clipped to the crop
        gt = gt[inside]
        gt.translate_([-left, -top])
        gt.clip_((new_h, new_w))
        results['gt_bboxes'] = gt
        for key in ('gt_bboxes_labels', 'gt_ignore_flags'):
            if key in results:
                results[key] = results[key][inside]
        if 'gt_masks' in results:
            results['gt_masks'] = results['gt_masks'][
                np.flatnonzero(inside)].crop(
                    np.array([left, top, left + new_w, top + new_h]))
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(min_scale={self.min_scale}, '
                f'max_scale={self.max_scale}, options={self.options}, '
                f'trials={self.trials}, p={self.p})')
