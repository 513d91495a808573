"""RT-DETR's batch-level multi-scale training, as an mmdet batch augment.

The RT-DETR authors resize each training batch, not each image: their
``BatchImageCollateFunction`` (lyuwenyu/RT-DETR,
``rtdetrv2_pytorch/src/data/dataloader.py``) draws one size from ``scales``
per batch (``random.choice``) and resizes the batch's images (all 640 x 640
after the per-image ``Resize``) with ``F.interpolate(images, size=s)``,
PyTorch's default nearest-neighbour mode, to ``s x s``, until the epoch
``stop_epoch`` (0-based; from it on, 640 x 640). Their boxes are normalised,
so they need no change; mmdet's are in pixels, so this scales them.

mmdet's ``BatchSyncRandomResize`` (YOLOX) draws a size from a range in
steps of 32 with the batch's aspect ratio, bilinear, every ``interval``
iterations, and has no stop; this module is the authors' rule. It is
stopped by :class:`~mmpe.engine.BatchResizeStopHook` (``enabled``), as the
authors' collate function is by the epoch.
"""
import random
from numbers import Integral
from typing import List, Sequence, Tuple, Union

from torch import Tensor, nn
from torch.nn import functional as F

from mmdet.registry import MODELS
from mmdet.structures import DetDataSample

#: The RT-DETRv2 recipes' scales (``configs/rtdetrv2/include/
#: dataloader.yml``): 480 to 800 in steps of 32, 640 three times.
RTDETR_SCALES = (480, 512, 544, 576, 608, 640, 640, 640, 672, 704, 736, 768,
                 800)
MODES = ('nearest', 'bilinear')


def _size(scale) -> Tuple[int, int]:
    """``s`` -> ``(s, s)``; ``(h, w)`` as it is."""
    if isinstance(scale, Integral) and not isinstance(scale, bool):
        return int(scale), int(scale)
    return int(scale[0]), int(scale[1])


def _check_scales(scales) -> Tuple[Tuple[int, int], ...]:
    ok = isinstance(scales, (list, tuple)) and len(scales) > 0
    sizes = []
    for scale in scales if ok else ():
        single = isinstance(scale, Integral) and not isinstance(scale, bool)
        pair = isinstance(scale, (list, tuple)) and len(scale) == 2 and all(
            isinstance(s, Integral) and not isinstance(s, bool)
            for s in scale)
        if not (single or pair) or min(_size(scale)) <= 0:
            ok = False
            break
        sizes.append(_size(scale))
    if not ok:
        raise ValueError(
            f'Unsupported `scales` {scales!r} for RTDETRBatchResize, please '
            'give a non-empty list of positive sizes (s for s x s, or '
            '(h, w)), e.g. [480, 512, ..., 800]')
    return tuple(sizes)


@MODELS.register_module()
class RTDETRBatchResize(nn.Module):
    """Resize a training batch to one size drawn from ``scales``.

    In ``DetDataPreprocessor(batch_augments=[...])``: it gets the padded,
    normalised batch and its data samples (training only), and returns the
    resized batch with each sample's ``img_shape``, ``pad_shape``,
    ``batch_input_shape`` and ground-truth boxes (``gt_instances``,
    ``ignored_instances``) scaled alike. Nearest-neighbour resizing commutes
    with the per-channel normalisation, so resizing after it (here) equals
    the authors' resizing before it.

    Args:
        scales (list): Sizes to draw from, one per batch with equal
            probability (a size listed twice is drawn twice as often): ``s``
            for ``s x s`` or ``(h, w)``. Defaults to the RT-DETRv2 recipes'
            ``RTDETR_SCALES``.
        mode (str): Interpolation, ``'nearest'`` (the authors': PyTorch's
            default) or ``'bilinear'``. Defaults to ``'nearest'``.

    Attributes:
        enabled (bool): False returns batches unchanged (set by
            ``BatchResizeStopHook`` from its epoch on).
    """

    def __init__(self,
                 scales: Sequence[Union[int, Sequence[int]]] = RTDETR_SCALES,
                 mode: str = 'nearest') -> None:
        super().__init__()
        self.sizes = _check_scales(scales)
        if mode not in MODES:
            raise ValueError(f'Unsupported `mode` {mode!r} for '
                             f'RTDETRBatchResize, please choose from {MODES}')
        self.mode = mode
        self.enabled = True

    def forward(self, inputs: Tensor, data_samples: List[DetDataSample]
                ) -> Tuple[Tensor, List[DetDataSample]]:
        """``inputs`` (B, C, H, W) -> (B, C, h, w), ``(h, w)`` drawn from
        the sizes; the samples' shapes and boxes scaled by ``h / H``,
        ``w / W``."""
        if not self.enabled:
            return inputs, data_samples
        size = random.choice(self.sizes)
        height, width = inputs.shape[-2:]
        if (height, width) == size:
            return inputs, data_samples
        scale_y, scale_x = size[0] / height, size[1] / width
        align = None if self.mode == 'nearest' else False
        inputs = F.interpolate(
            inputs, size=size, mode=self.mode, align_corners=align)
        for sample in data_samples:
            img_h, img_w = sample.img_shape[:2]
            pad_h, pad_w = sample.metainfo.get('pad_shape', (height, width))
            sample.set_metainfo({
                'img_shape': (int(img_h * scale_y), int(img_w * scale_x)),
                'pad_shape': (int(pad_h * scale_y), int(pad_w * scale_x)),
                'batch_input_shape': size,
            })
            for key in ('gt_instances', 'ignored_instances'):
                if key in sample and 'bboxes' in sample.get(key):
                    boxes = sample.get(key).bboxes
                    if hasattr(boxes, 'rescale_'):  # mmdet's box types
                        boxes.rescale_((scale_x, scale_y))
                    else:  # (N, 4) x1, y1, x2, y2
                        boxes[..., 0::2] *= scale_x
                        boxes[..., 1::2] *= scale_y
        return inputs, data_samples

    def extra_repr(self) -> str:
        return (f'sizes={self.sizes}, mode={self.mode!r}, '
                f'enabled={self.enabled}')
