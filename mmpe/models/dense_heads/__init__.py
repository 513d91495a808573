"""Detection heads: RT-DETR's (decoder side, losses, post-processing)."""
from .rtdetr_head import RTDETRHead

__all__ = ['RTDETRHead']
