"""Optimizer wrapper constructors (registered in mmdet's registry)."""
from .layer_decay import ViTLayerDecayOptimWrapperConstructor

__all__ = ['ViTLayerDecayOptimWrapperConstructor']
