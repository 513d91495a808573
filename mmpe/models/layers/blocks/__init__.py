"""Floor 5: the layouts around the core: mmcv (DETR) and timm (ViT)."""
