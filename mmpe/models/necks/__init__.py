from .simple_fpn import LayerNorm2d, ViTSimpleFPN

__all__ = ['LayerNorm2d', 'ViTSimpleFPN']
