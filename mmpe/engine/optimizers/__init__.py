"""Optimizer wrapper constructors (registered in mmdet's registry)."""
from .layer_decay import ViTLayerDecayOptimWrapperConstructor
from .lr_factors import LrFactorOptimWrapperConstructor

__all__ = [
    'LrFactorOptimWrapperConstructor', 'ViTLayerDecayOptimWrapperConstructor'
]
