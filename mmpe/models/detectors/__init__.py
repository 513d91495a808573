from .detr_irpe import (iRPEDETR, iRPEDetrTransformerEncoder,
                        iRPEDetrTransformerEncoderLayer)
from .padding_aware import (PaddingAwareDETR, PaddingAwareMaskRCNN,
                            PaddingAwareMixin, PaddingAwareRetinaNet)

__all__ = [
    'PaddingAwareDETR', 'PaddingAwareMaskRCNN', 'PaddingAwareMixin',
    'PaddingAwareRetinaNet',
    'iRPEDETR', 'iRPEDetrTransformerEncoder', 'iRPEDetrTransformerEncoderLayer'
]
