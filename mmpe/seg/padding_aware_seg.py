"""A segmentor whose backbone sees each batch's padding.

MMSegmentation's ``SegDataPreProcessor`` pads the images of a training batch
bottom/right to the crop size (``size``) or a multiple of ``size_divisor``
(and, with its ``test_cfg``, test images too), and ``EncoderDecoder`` calls
``self.backbone(inputs)``: the padding is image content for the backbone.
A mask-aware ViT (CPVT) can do better -- padded tokens are never attended to
and the PEG's zero padding starts at each image's own border (Chu et al.
2021, Sec. 3.2) -- so each image gets its single-image backbone features.

:class:`PaddingAwareEncoderDecoder` builds the ``(B, H, W)`` pixel mask
(True on padding) from each image's ``img_shape`` -- the data samples' in
``loss`` / ``_forward``, the image metas' in ``encode_decode`` (whole and
slide inference) -- and calls ``self.backbone(inputs, padding_mask=mask)``.
Nothing is stored between calls and no parameter is added: the state dict
is the plain ``EncoderDecoder``'s, so checkpoints load into either.

What the mask does not reach: the neck and decode head are convolutional
and zero-pad at the *batch* border, so within a few cells of an image's
bottom/right border their outputs still see the (masked, zero) features of
the padding instead of a zero border; the batch and the image alone agree
exactly in the backbone and away from that band (see
``tests/test_seg/test_padding_aware_seg.py``). Slide inference gives each
window its part of the batch mask (windows over the bottom/right padding of
a test batch padded to ``size_divisor``).

Config switch: ``model.type='PaddingAwareEncoderDecoder'`` instead of
``'EncoderDecoder'``.
"""
import inspect
from typing import List, Optional, Sequence

from torch import Tensor

from mmseg.models.segmentors import EncoderDecoder
from mmseg.registry import MODELS
from mmseg.utils import OptSampleList, SampleList
from ..models.utils.padding_mask import (padding_mask_from_samples,
                                         padding_mask_from_shapes)


@MODELS.register_module()
class PaddingAwareEncoderDecoder(EncoderDecoder):
    """mmseg's ``EncoderDecoder`` whose backbone gets the padding mask.

    The backbone's ``forward`` must take ``padding_mask`` (a ``(B, H, W)``
    bool pixel mask, True on padding), as :class:`mmpe.models.CPVT` does.
    Arguments are those of ``EncoderDecoder``.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        params = inspect.signature(self.backbone.forward).parameters
        if 'padding_mask' not in params:
            raise ValueError(
                f'{type(self).__name__}: backbone '
                f'{type(self.backbone).__name__} takes no `padding_mask`; '
                'mask-aware backbones: CPVT (or use model.type='
                "'EncoderDecoder')")

    def extract_feat(self,
                     inputs: Tensor,
                     padding_mask: Optional[Tensor] = None) -> List[Tensor]:
        """Backbone (told the padding) and optional neck.

        Args:
            inputs (Tensor): Padded images ``(B, C, H, W)``.
            padding_mask (Tensor, optional): ``(B, H, W)`` bool, True on
                padding. None: nothing is padded.

        Returns:
            list[Tensor]: The backbone's (or neck's) feature maps.
        """
        x = self.backbone(inputs, padding_mask=padding_mask)
        if self.with_neck:
            x = self.neck(x)
        return x

    def encode_decode(self, inputs: Tensor,
                      batch_img_metas: List[dict]) -> Tensor:
        """Logits ``(B, num_classes, H, W)`` of images whose valid regions
        are the metas' ``img_shape`` (at the top-left of ``inputs``)."""
        mask = padding_mask_from_shapes(
            [_hw(meta['img_shape']) for meta in batch_img_metas],
            tuple(inputs.shape[-2:]), inputs.device)
        x = self.extract_feat(inputs, mask if mask.any() else None)
        return self.decode_head.predict(x, batch_img_metas, self.test_cfg)

    def slide_inference(self, inputs: Tensor,
                        batch_img_metas: List[dict]) -> Tensor:
        """Sliding-window logits ``(B, num_classes, H, W)``.

        The windows of ``test_cfg.crop_size`` at ``test_cfg.stride`` (the
        last one flush with the bottom/right border, as mmseg's), averaged
        where they overlap; each window's backbone gets its slice of the
        batch's padding mask.
        """
        h_stride, w_stride = self.test_cfg.stride
        h_crop, w_crop = self.test_cfg.crop_size
        batch_size, _, h_img, w_img = inputs.shape
        full_mask = padding_mask_from_shapes(
            [_hw(meta['img_shape']) for meta in batch_img_metas],
            (h_img, w_img), inputs.device)
        h_grids = max(h_img - h_crop + h_stride - 1, 0) // h_stride + 1
        w_grids = max(w_img - w_crop + w_stride - 1, 0) // w_stride + 1
        preds = inputs.new_zeros((batch_size, self.out_channels, h_img,
                                  w_img))
        count = inputs.new_zeros((batch_size, 1, h_img, w_img))
        for h_idx in range(h_grids):
            for w_idx in range(w_grids):
                y2 = min(h_idx * h_stride + h_crop, h_img)
                x2 = min(w_idx * w_stride + w_crop, w_img)
                y1, x1 = max(y2 - h_crop, 0), max(x2 - w_crop, 0)
                crop = inputs[:, :, y1:y2, x1:x2]
                mask = full_mask[:, y1:y2, x1:x2]
                # a torch.Size img_shape: the head resizes to the window
                metas = [dict(meta, img_shape=crop.shape[2:])
                         for meta in batch_img_metas]
                x = self.extract_feat(crop, mask if mask.any() else None)
                logits = self.decode_head.predict(x, metas, self.test_cfg)
                preds[:, :, y1:y2, x1:x2] += logits
                count[:, :, y1:y2, x1:x2] += 1
        return preds / count

    def loss(self, inputs: Tensor, data_samples: SampleList) -> dict:
        """Losses of a padded batch; as ``EncoderDecoder.loss``."""
        x = self.extract_feat(inputs, _mask(data_samples, inputs))
        losses = dict()
        losses.update(self._decode_head_forward_train(x, data_samples))
        if self.with_auxiliary_head:
            losses.update(self._auxiliary_head_forward_train(x, data_samples))
        return losses

    def _forward(self,
                 inputs: Tensor,
                 data_samples: OptSampleList = None) -> Tensor:
        """Decode-head logits at the head's stride (no samples: no mask)."""
        return self.decode_head.forward(
            self.extract_feat(inputs, _mask(data_samples, inputs)))


def _hw(shape: Sequence[int]) -> tuple:
    return int(shape[0]), int(shape[1])


def _mask(data_samples: OptSampleList, inputs: Tensor) -> Optional[Tensor]:
    """The padding mask of ``inputs`` from its samples (None: no samples or
    nothing padded)."""
    if not data_samples:
        return None
    mask = padding_mask_from_samples(data_samples, inputs)
    return mask if mask.any() else None
