from .box_rpb_decoders import BoxRPBConditionalDecoder, BoxRPBDABDecoder
from .conditional_detr_irpe import iRPEConditionalDETR
from .dab_detr_irpe import iRPEDABDETR
from .decoder_pe_mixin import DecoderPEMixin
from .detr_irpe import iRPEDETR
from .irpe_encoder_mixin import iRPEEncoderMixin
from .irpe_encoders import (iRPEDABDetrTransformerEncoder,
                            iRPEDetrTransformerEncoder,
                            iRPEDetrTransformerEncoderLayer)
from .padding_aware import (PaddingAwareDETR, PaddingAwareMaskRCNN,
                            PaddingAwareMixin, PaddingAwareRetinaNet)

__all__ = [
    'PaddingAwareDETR', 'PaddingAwareMaskRCNN', 'PaddingAwareMixin',
    'PaddingAwareRetinaNet',
    'iRPEDETR', 'iRPEDetrTransformerEncoder', 'iRPEDetrTransformerEncoderLayer',
    'iRPEConditionalDETR', 'iRPEDABDETR', 'iRPEEncoderMixin',
    'iRPEDABDetrTransformerEncoder', 'BoxRPBConditionalDecoder',
    'BoxRPBDABDecoder', 'DecoderPEMixin'
]
