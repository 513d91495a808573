from .padding_mask import padding_mask_from_samples, padding_mask_from_shapes
from .rtdetr_decoder_keys import convert_rtdetr_decoder, rtdetr_decoder_key

__all__ = [
    'padding_mask_from_samples', 'padding_mask_from_shapes',
    'convert_rtdetr_decoder', 'rtdetr_decoder_key'
]
