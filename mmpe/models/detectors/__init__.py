from .box_rpb_decoders import BoxRPBConditionalDecoder, BoxRPBDABDecoder
from .conditional_detr_pe import PEConditionalDETR
from .dab_detr_pe import PEDABDETR
from .decoder_pe_mixin import DecoderPEMixin
from .detr_pe import PEDETR
from .encoder_pe_mixin import PEEncoderMixin
from .pe_encoders import (PEDABDetrTransformerEncoder,
                          PEDetrTransformerEncoder,
                          PEDetrTransformerEncoderLayer)
from .padding_aware import (PaddingAwareDETR, PaddingAwareDINO,
                            PaddingAwareMaskRCNN, PaddingAwareMixin,
                            PaddingAwareRetinaNet)
from .rtdetr import RTDETR

# the names before the rename (these classes also carry RoPE, or nothing);
# the registry knows the detectors under both names
iRPEDETR, iRPEConditionalDETR = PEDETR, PEConditionalDETR
iRPEDABDETR = PEDABDETR
iRPEEncoderMixin = PEEncoderMixin
iRPEDetrTransformerEncoder = PEDetrTransformerEncoder
iRPEDetrTransformerEncoderLayer = PEDetrTransformerEncoderLayer
iRPEDABDetrTransformerEncoder = PEDABDetrTransformerEncoder

__all__ = [
    'PaddingAwareDETR', 'PaddingAwareDINO', 'PaddingAwareMaskRCNN',
    'PaddingAwareMixin',
    'PaddingAwareRetinaNet', 'RTDETR',
    'PEDETR', 'PEDetrTransformerEncoder', 'PEDetrTransformerEncoderLayer',
    'PEConditionalDETR', 'PEDABDETR', 'PEEncoderMixin',
    'PEDABDetrTransformerEncoder', 'BoxRPBConditionalDecoder',
    'BoxRPBDABDecoder', 'DecoderPEMixin', 'iRPEDETR', 'iRPEConditionalDETR',
    'iRPEDABDETR', 'iRPEEncoderMixin', 'iRPEDetrTransformerEncoder',
    'iRPEDetrTransformerEncoderLayer', 'iRPEDABDetrTransformerEncoder'
]
