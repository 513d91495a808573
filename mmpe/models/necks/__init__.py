from .csp_rep import CSPRepLayer, RepVGGBlock
from .rtdetr_hybrid_encoder import RTDETRHybridEncoder
from .simple_fpn import LayerNorm2d, ViTSimpleFPN

__all__ = [
    'CSPRepLayer', 'LayerNorm2d', 'RTDETRHybridEncoder', 'RepVGGBlock',
    'ViTSimpleFPN'
]
