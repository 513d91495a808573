from ..utils.timm_vit import timm_vit_to_cpvt
from .cpvt import CPVT
from .presnet import PResNetVd

__all__ = ['CPVT', 'PResNetVd', 'timm_vit_to_cpvt']
