from ..utils.timm_vit import timm_vit_to_cpvt
from .cpvt import CPVT

__all__ = ['CPVT', 'timm_vit_to_cpvt']
