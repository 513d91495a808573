"""The pixel padding mask of a padded detection batch.

MMDetection's data preprocessor pads the images of a batch bottom/right to
one size ``batch_input_shape``; each data sample's ``img_shape`` is the
valid region of its image, at the top-left. A mask-aware backbone (CPVT)
uses the mask to keep padded tokens out of attention and to start the PEG's
zero padding at each image's own border (Chu et al. 2021, Sec. 3.2).
:class:`mmpe.models.detectors.PaddingAwareMixin` passes it to the backbone.
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


def padding_mask_from_shapes(shapes: Sequence[Tuple[int, int]],
                             batch_shape: Tuple[int, int],
                             device: Optional[torch.device] = None) -> Tensor:
    """``(B, H, W)`` bool mask, True on padding, for images whose valid
    regions ``(h_i, w_i)`` sit at the top-left of an ``(H, W)`` batch."""
    H, W = batch_shape
    mask = torch.ones(len(shapes), H, W, dtype=torch.bool, device=device)
    for i, shape in enumerate(shapes):
        h, w = int(shape[0]), int(shape[1])
        if not (0 < h <= H and 0 < w <= W):
            raise ValueError(
                f'image {i}: valid shape {(h, w)} does not fit the batch '
                f'shape {(H, W)} (each side must be in 1..the batch side)')
        mask[i, :h, :w] = False
    return mask


def padding_mask_from_samples(batch_data_samples: Sequence,
                              batch_inputs: Tensor) -> Tensor:
    """``(B, H, W)`` bool mask, True on padding, of ``batch_inputs``
    ``(B, C, H, W)`` as its data samples describe it.

    Each sample must carry ``img_shape`` (its valid ``(h, w)``); a sample
    that also carries ``batch_input_shape`` must describe an input of
    ``batch_inputs``' size, so that a mask is never laid over a different
    tensor (a resized or cropped view of the batch).
    """
    B, H, W = batch_inputs.shape[0], *batch_inputs.shape[-2:]
    if len(batch_data_samples) != B:
        raise ValueError(f'{len(batch_data_samples)} data samples for a '
                         f'batch of {B} images; pass one sample per image')
    shapes = []
    for i, sample in enumerate(batch_data_samples):
        meta = sample.metainfo
        if 'img_shape' not in meta:
            raise ValueError(
                f'data sample {i} has no `img_shape` (metainfo keys: '
                f'{sorted(meta)}); the padding mask needs each valid shape')
        batch_shape = meta.get('batch_input_shape', (H, W))
        if tuple(batch_shape) != (H, W):
            raise ValueError(
                f'data sample {i} describes a batch of {tuple(batch_shape)} '
                f'but the input is {(H, W)}: the samples do not belong to '
                'these inputs (pass matching samples, or None for no mask)')
        shapes.append(meta['img_shape'][:2])
    return padding_mask_from_shapes(shapes, (H, W), batch_inputs.device)


def token_padding_mask(padding_mask: Tensor, patch_size: int,
                       hw_shape: Tuple[int, int]) -> Tensor:
    """Pixel mask ``(B, H, W)`` -> token mask ``(B, h, w)`` of a patch grid.

    A token is padding only if all of its ``patch_size x patch_size``
    pixels are (pixels past ``H``, ``W`` up to the grid count as padding).
    """
    p = patch_size
    h, w = hw_shape
    if padding_mask.dim() != 3:
        raise ValueError(f'`padding_mask` must be (B, H, W), got shape '
                         f'{tuple(padding_mask.shape)}')
    valid = (~padding_mask.bool()).unsqueeze(1).float()
    H, W = valid.shape[-2:]
    valid = F.pad(valid, (0, w * p - W, 0, h * p - H))
    valid = F.max_pool2d(valid, p, p)  # 1 where any pixel is valid
    return valid[:, 0] < 0.5
