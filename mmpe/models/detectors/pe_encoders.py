"""The DETR-family encoders with :class:`PEMultiheadAttention`, under
their earlier import path; they live in
:mod:`mmpe.models.layers.blocks.pe_encoders` (the RT-DETR neck builds its
AIFI from them, and a neck may not import a detector module)."""
from ..layers.blocks.pe_encoders import (PE_ATTN_KEYS,
                                         PEDABDetrTransformerEncoder,
                                         PEDetrTransformerEncoder,
                                         PEDetrTransformerEncoderLayer,
                                         PEEncoderLayersMixin,
                                         encoder_without_pe_args,
                                         without_pe_args)

__all__ = [
    'PE_ATTN_KEYS', 'PEDABDetrTransformerEncoder', 'PEDetrTransformerEncoder',
    'PEDetrTransformerEncoderLayer', 'PEEncoderLayersMixin',
    'encoder_without_pe_args', 'without_pe_args'
]
