"""ONNX export of a DETR-family detector's tensor forward: padded images
(and each image's valid size) -> class scores and boxes of the last decoder
layer.

mmdet's ``DETR.pre_transformer`` builds the padding mask in a Python loop
over the data samples (``masks[i, :img_h, :img_w] = 0``), which a graph
cannot take as an input. :class:`DETRExportWrapper` exports *around* it, as
MMDeploy's rewrites do, without changing mmdet: the graph gets each image's
valid ``(h, w)`` as a tensor ``img_shapes`` and builds the same mask with
tensor ops; every other step is the detector's own method (``extract_feat``,
``forward_encoder``, ``pre_decoder``, ``forward_decoder``,
``bbox_head.forward``), and mmpe's encoder position encodings come from
:meth:`~mmpe.models.detectors.PEEncoderMixin.encoder_pe_inputs`, the one
implementation that the detector's own ``pre_transformer`` also calls. It
reads each image's valid extent from the feature-level mask built here
from ``img_shapes``, so normalised RoPE coordinates (DINOv3's) come from
the same valid sizes as mmdet's sine encoding, in the graph and in
PyTorch alike.

Graph (all sizes but ``Q`` and ``C`` dynamic)::

    images      (B, 3, H, W)  float32, normalised and padded bottom/right
    img_shapes  (B, 2)        int64, each image's valid (h, w) at top-left
    -> scores   (B, Q, C)     the head's class logits (C = num_classes + 1
                              for DETR's softmax head, num_classes for the
                              sigmoid heads of Conditional / DAB-DETR)
    -> boxes    (B, Q, 4)     normalised (cx, cy, w, h) in [0, 1] of the
                              valid image, as the head outputs them
"""
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmdet.models.detectors import (DABDETR, DETR, ConditionalDETR,
                                    DeformableDETR, DetectionTransformer)
from mmdet.structures import DetDataSample
from ..models.detectors import (PaddingAwareMixin, PEConditionalDETR,
                                PEDABDETR, PEDETR, PEEncoderMixin)
from ..models.detectors.padding_aware import PaddingAwareDETR
from ..models.detectors.rtdetr import RTDETR
from .img_shapes import padding_mask_from_img_shapes
from .onnx_export import export_onnx
from .rtdetr_onnx import RTDETRExportWrapper

#: Detector classes whose tensor forward exports (their subclasses too, as
#: long as they keep these classes' ``pre_transformer``).
#: RT-DETR exports with :class:`~mmpe.deployment.RTDETRExportWrapper`.
SUPPORTED_DETECTORS = (DETR, ConditionalDETR, DABDETR, PEDETR,
                       PEConditionalDETR, PEDABDETR, PaddingAwareDETR,
                       RTDETR)
SUPPORTED_NAMES = tuple(cls.__name__ for cls in SUPPORTED_DETECTORS)

#: The pre_transformer implementations the wrapper reproduces.
_KNOWN_PRE_TRANSFORMERS = (DETR.pre_transformer,
                           PEEncoderMixin.pre_transformer)

INPUT_NAMES = ('images', 'img_shapes')
OUTPUT_NAMES = ('scores', 'boxes')


def _refusal(detector: nn.Module) -> Optional[str]:
    """Why ``detector`` cannot be exported (None: it can)."""
    if isinstance(detector, RTDETR):
        return None
    if isinstance(detector, DeformableDETR):
        return ('its encoder and decoder use multi-scale deformable '
                'attention over several feature levels (mmcv\'s compiled '
                'MultiScaleDeformableAttention op, which has no ONNX '
                'export here); only single-scale DETR encoders with plain '
                'multi-head attention export')
    if not isinstance(detector, DETR):
        if isinstance(detector, DetectionTransformer):
            return ('it is a DETR-family detector other than DETR, '
                    'Conditional DETR or DAB-DETR, whose transformer '
                    'inputs this wrapper does not reproduce')
        return ('it is not a DETR-family detector: its outputs are not one '
                'set of per-query class scores and boxes (anchor or RoI '
                'heads need NMS / RoIAlign post-processing, mmcv ops)')
    pre_transformer = type(detector).pre_transformer
    if pre_transformer not in _KNOWN_PRE_TRANSFORMERS:
        return (f'it overrides `pre_transformer` '
                f'({pre_transformer.__qualname__}), which the export '
                'wrapper would not reproduce')
    return None


def check_exportable(detector: nn.Module) -> None:
    """Raise a ValueError naming the detector class and why, unless its
    tensor forward exports with :class:`DETRExportWrapper`."""
    reason = _refusal(detector)
    if reason is not None:
        raise ValueError(
            f'Unsupported detector {type(detector).__name__} for ONNX '
            f'export: {reason}; please choose from {SUPPORTED_NAMES} (or a '
            'subclass keeping their pre_transformer)')


class DETRExportWrapper(nn.Module):
    """A DETR-family detector's tensor forward with tensor inputs only.

    ``forward(images, img_shapes) -> (scores, boxes)`` of the last decoder
    layer (shapes in the module docstring). Equal to the detector's
    ``forward(images, data_samples, mode='tensor')`` (last layer) when the
    samples carry the same ``img_shape`` and the batch's
    ``batch_input_shape``.

    Args:
        detector (nn.Module): One of :data:`SUPPORTED_DETECTORS` (or a
            subclass keeping their ``pre_transformer``); other classes
            raise a ValueError naming why.
    """

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        check_exportable(detector)
        if isinstance(detector, RTDETR):
            raise ValueError('DETRExportWrapper: RTDETR has its own wrapper, '
                             'RTDETRExportWrapper (or use export_wrapper)')
        self.detector = detector

    def extract_feat(self, images: Tensor, pixel_mask: Tensor) -> Tuple:
        """Backbone (+ neck) features; a padding-aware detector's
        backbone gets the pixel mask, as its ``extract_feat`` gives it."""
        detector = self.detector
        if not isinstance(detector, PaddingAwareMixin):
            return detector.extract_feat(images)
        feats = detector.backbone(images, padding_mask=pixel_mask)
        if detector.with_neck:
            feats = detector.neck(feats)
        return feats

    def pre_transformer(self, img_feats: Tuple[Tensor],
                        pixel_mask: Tensor) -> Tuple[Dict, Dict]:
        """mmdet's ``DETR.pre_transformer`` with the pixel mask as a tensor
        (not a loop over data samples), then mmpe's encoder inputs.

        Args:
            img_feats (tuple[Tensor]): Neck outputs; the last,
                ``(B, C, h, w)``, is used.
            pixel_mask (Tensor): ``(B, H, W)`` bool, True on padding.

        Returns:
            tuple[dict, dict]: The encoder and decoder inputs, as the
            detector's ``pre_transformer`` returns them.
        """
        detector = self.detector
        feat = img_feats[-1]
        batch_size, feat_dim = feat.shape[:2]
        # as mmdet: nearest resize of the float pixel mask (1 = padding)
        masks = F.interpolate(
            pixel_mask.to(feat.dtype).unsqueeze(1),
            size=feat.shape[-2:]).to(torch.bool).squeeze(1)
        pos_embed = detector.positional_encoding(masks)
        feat = feat.view(batch_size, feat_dim, -1).permute(0, 2, 1)
        pos_embed = pos_embed.view(batch_size, feat_dim, -1).permute(0, 2, 1)
        masks = masks.view(batch_size, -1)
        encoder_inputs_dict = dict(
            feat=feat, feat_mask=masks, feat_pos=pos_embed)
        decoder_inputs_dict = dict(memory_mask=masks, memory_pos=pos_embed)
        if isinstance(detector, PEEncoderMixin):
            encoder_inputs_dict, decoder_inputs_dict = \
                detector.encoder_pe_inputs(img_feats, encoder_inputs_dict,
                                           decoder_inputs_dict)
        return encoder_inputs_dict, decoder_inputs_dict

    def forward(self, images: Tensor,
                img_shapes: Tensor) -> Tuple[Tensor, Tensor]:
        """Last decoder layer's ``(scores (B, Q, C), boxes (B, Q, 4))``.

        Args:
            images (Tensor): ``(B, 3, H, W)`` normalised, padded images.
            img_shapes (Tensor): ``(B, 2)`` int64 valid ``(h, w)`` of each.
        """
        detector = self.detector
        pixel_mask = padding_mask_from_img_shapes(img_shapes,
                                                  images.shape[-2:])
        img_feats = self.extract_feat(images, pixel_mask)
        encoder_inputs_dict, decoder_inputs_dict = self.pre_transformer(
            img_feats, pixel_mask)
        encoder_outputs_dict = detector.forward_encoder(**encoder_inputs_dict)
        tmp_dec_in, head_inputs_dict = detector.pre_decoder(
            **encoder_outputs_dict)
        decoder_inputs_dict.update(tmp_dec_in)
        decoder_outputs_dict = detector.forward_decoder(**decoder_inputs_dict)
        head_inputs_dict.update(decoder_outputs_dict)
        all_scores, all_boxes = detector.bbox_head.forward(**head_inputs_dict)
        return all_scores[-1], all_boxes[-1]


def export_wrapper(detector: nn.Module) -> nn.Module:
    """The export wrapper of ``detector`` (:class:`RTDETRExportWrapper`
    for RT-DETR, else :class:`DETRExportWrapper`), in eval mode; a
    detector that does not export raises a ValueError naming why."""
    check_exportable(detector)
    if isinstance(detector, RTDETR):
        return RTDETRExportWrapper(detector).eval()
    return DETRExportWrapper(detector).eval()


def predict_from_outputs(detector: nn.Module, scores: Tensor, boxes: Tensor,
                         batch_img_metas: List[dict],
                         rescale: bool = True) -> List:
    """Detections (``InstanceData`` per image) from the graph's outputs
    with the detector head's own post-processing: mmdet's
    ``predict_by_feat`` of the DETR heads, ``RTDETRHead.predict`` (top-k
    over sigmoid scores) for RT-DETR.

    Args:
        detector (nn.Module): The exported detector (or one built from its
            config: only its head's ``test_cfg`` is used).
        scores (Tensor): ``(B, Q, C)`` graph output.
        boxes (Tensor): ``(B, Q, 4)`` graph output.
        batch_img_metas (list[dict]): each image's ``img_shape`` and, with
            ``rescale``, ``scale_factor``.
        rescale (bool): Boxes in the original image's pixels.
    """
    check_exportable(detector)
    if isinstance(detector, RTDETR):
        samples = [DetDataSample(metainfo=meta) for meta in batch_img_metas]
        return detector.bbox_head.predict(scores[None], boxes[None], samples,
                                          rescale=rescale)
    return detector.bbox_head.predict_by_feat(
        scores[None], boxes[None], batch_img_metas=batch_img_metas,
        rescale=rescale)


def detr_dynamic_shapes() -> Dict[str, Dict[int, object]]:
    """Batch, height and width dynamic; ``img_shapes`` shares the batch."""
    from torch.export import Dim
    batch = Dim('batch', min=1, max=1024)
    return {
        'images': {
            0: batch,
            2: Dim.DYNAMIC,
            3: Dim.DYNAMIC
        },
        'img_shapes': {
            0: batch
        }
    }


def export_detector_onnx(detector: nn.Module,
                         out_file: str,
                         images: Tensor,
                         img_shapes: Optional[Tensor] = None,
                         opset_version: Optional[int] = None,
                         optimize: bool = True) -> nn.Module:
    """Export a DETR-family detector (see :class:`DETRExportWrapper`
    and, for RT-DETR, :class:`RTDETRExportWrapper`).

    Args:
        detector (nn.Module): The detector, in eval mode.
        out_file (str): ``.onnx`` file to write.
        images (Tensor): Example ``(B, 3, H, W)`` batch of the trace,
            ``B, H, W >= 2`` (the exported graph takes any size).
        img_shapes (Tensor, optional): Example ``(B, 2)`` int64 valid sizes;
            defaults to the whole batch for every image.
        opset_version (int, optional): ONNX opset (None: the exporter's).
        optimize (bool): Optimise the graph (see
            :func:`~mmpe.deployment.export_onnx`).

    Returns:
        nn.Module: The exported wrapper (its forward is the PyTorch
        reference of the graph).
    """
    wrapper = export_wrapper(detector)
    if img_shapes is None:
        img_shapes = images.new_tensor(images.shape[-2:], dtype=torch.long)
        img_shapes = img_shapes.expand(images.shape[0], 2).contiguous()
    if min(images.shape[0], *images.shape[-2:]) < 2:
        raise ValueError(
            f'Example images of shape {tuple(images.shape)}: batch, height '
            'and width must be >= 2 (torch.export fixes sizes 0 and 1); '
            'the exported graph still takes a batch of 1')
    export_onnx(
        wrapper, (images, img_shapes),
        out_file,
        input_names=INPUT_NAMES,
        output_names=OUTPUT_NAMES,
        dynamic_shapes=detr_dynamic_shapes(),
        opset_version=opset_version,
        optimize=optimize)
    return wrapper
