from .simple_fpn import ViTSimpleFPN

__all__ = ['ViTSimpleFPN']
