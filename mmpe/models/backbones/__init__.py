from .cpvt import CPVT, timm_vit_to_cpvt

__all__ = ['CPVT', 'timm_vit_to_cpvt']
