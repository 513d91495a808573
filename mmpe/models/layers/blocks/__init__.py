"""Floor 8: the layouts around the core: mmcv (DETR) and timm (ViT)."""
