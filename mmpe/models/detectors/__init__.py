from .detr_irpe import (iRPEDETR, iRPEDetrTransformerEncoder,
                        iRPEDetrTransformerEncoderLayer)

__all__ = [
    'iRPEDETR', 'iRPEDetrTransformerEncoder', 'iRPEDetrTransformerEncoderLayer'
]
