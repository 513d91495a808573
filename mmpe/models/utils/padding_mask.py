"""Hand a padded batch's padding mask to a mask-aware backbone.

MMDetection's data preprocessor pads the images of a batch bottom/right to
one size, and every detector calls ``self.backbone(batch_inputs)`` without
saying where the padding is. A CNN backbone cannot use that information
anyway, but a ViT can: CPVT keeps padded tokens out of attention and zeroes
them before the PEG, so each image's zero-padding cue is its own border
(Chu et al. 2021, Sec. 3.2). :func:`attach_padding_mask` closes the gap
without changing any detector: a forward pre-hook on the detector reads
each data sample's ``img_shape`` (the valid region) and gives the shapes to
the backbone, which turns them into a mask on its next forward.
"""
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle


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


def attach_padding_mask(detector: nn.Module) -> RemovableHandle:
    """Make ``detector`` tell its backbone where each batch is padded.

    The backbone must have ``set_valid_shapes(shapes)`` (mmpe's ``CPVT``).
    Every call ``detector(inputs, data_samples, mode)`` -- training,
    validation and testing through MMEngine, or by hand -- first hands the
    samples' ``img_shape`` to the backbone; calls without data samples hand
    ``None`` (no mask).

    Returns:
        RemovableHandle: ``handle.remove()`` detaches it again.
    """
    backbone = getattr(detector, 'backbone', None)
    if not callable(getattr(backbone, 'set_valid_shapes', None)):
        raise TypeError(
            f'{type(detector).__name__}.backbone is '
            f'{type(backbone).__name__}, which takes no padding mask; '
            'mask-aware backbones: CPVT')

    def pre_hook(module, args, kwargs):
        samples = kwargs.get('data_samples', args[1] if len(args) > 1 else None)
        shapes = None
        if samples and all('img_shape' in s.metainfo for s in samples):
            shapes = [s.img_shape for s in samples]
        backbone.set_valid_shapes(shapes)

    return detector.register_forward_pre_hook(pre_hook, with_kwargs=True)
