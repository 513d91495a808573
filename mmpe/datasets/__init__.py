from .mask_polygons import mask_to_polygons
from .rtdetr_batch_resize import RTDETR_SCALES, RTDETRBatchResize
from .rtdetr_transforms import RandomIoUCrop, RandomPhotometricDistort
from .synthetic_coco import SyntheticCocoSummary, generate_synthetic_coco
from .synthetic_image import SyntheticImageParams, render_synthetic_image
from .synthetic_seg import (SYNTHETIC_SEG_CLASSES, SYNTHETIC_SEG_PALETTE,
                            generate_synthetic_seg, render_label_map)
from .synthetic_shapes import (SYNTHETIC_COCO_CLASSES, SYNTHETIC_COCO_METAINFO,
                               SYNTHETIC_COCO_PALETTE)

__all__ = [
    'RTDETR_SCALES', 'RTDETRBatchResize', 'RandomIoUCrop',
    'RandomPhotometricDistort',
    'SYNTHETIC_COCO_CLASSES', 'SYNTHETIC_COCO_PALETTE',
    'SYNTHETIC_COCO_METAINFO', 'SyntheticCocoSummary', 'SyntheticImageParams',
    'generate_synthetic_coco', 'mask_to_polygons', 'render_synthetic_image',
    'SYNTHETIC_SEG_CLASSES', 'SYNTHETIC_SEG_PALETTE', 'generate_synthetic_seg',
    'render_label_map'
]
