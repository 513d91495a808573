"""The ``encoder_pe`` setting's parser, under its earlier import path; it
lives in :mod:`mmpe.models.utils.encoder_pe` (the DETR-family detectors and
the RT-DETR neck share it, and a neck may not import a detector module)."""
from ..utils.encoder_pe import (ABSOLUTE_CHOICES, COORD_ARGS,
                                DECODER_POS_CHOICES, ENCODER_PE_KEYS,
                                RELATIVE_CHOICES, attention_pe_cfg,
                                parse_encoder_pe, parse_relative,
                                rope_coords_cfg)

__all__ = [
    'ABSOLUTE_CHOICES', 'COORD_ARGS', 'DECODER_POS_CHOICES',
    'ENCODER_PE_KEYS', 'RELATIVE_CHOICES', 'attention_pe_cfg',
    'parse_encoder_pe', 'parse_relative', 'rope_coords_cfg'
]
