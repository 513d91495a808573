from .padding_mask import padding_mask_from_samples, padding_mask_from_shapes

__all__ = ['padding_mask_from_samples', 'padding_mask_from_shapes']
