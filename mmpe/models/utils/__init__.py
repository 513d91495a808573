from .padding_mask import attach_padding_mask, padding_mask_from_shapes

__all__ = ['attach_padding_mask', 'padding_mask_from_shapes']
