from .synthetic_coco import (SYNTHETIC_COCO_CLASSES, SYNTHETIC_COCO_METAINFO,
                             SYNTHETIC_COCO_PALETTE, SyntheticCocoSummary,
                             generate_synthetic_coco, mask_to_polygons,
                             render_synthetic_image)

__all__ = [
    'SYNTHETIC_COCO_CLASSES', 'SYNTHETIC_COCO_PALETTE', 'SYNTHETIC_COCO_METAINFO',
    'SyntheticCocoSummary', 'generate_synthetic_coco', 'mask_to_polygons',
    'render_synthetic_image'
]
