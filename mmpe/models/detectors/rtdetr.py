"""RT-DETR as an MMDetection detector: backbone, hybrid encoder (the neck,
told each batch's padding) and :class:`~mmpe.models.dense_heads.RTDETRHead`.

Zhao et al., "DETRs Beat YOLOs on Real-time Object Detection" (CVPR 2024)
and Lv et al., "RT-DETRv2" (2024); released code
``rtdetrv2_pytorch/src/zoo/rtdetr/rtdetr.py`` (backbone -> encoder ->
decoder). Laid out as mmdet's ``DINO``: ``forward_transformer`` runs
``pre_transformer`` (the head's input projections, each image's valid
ratios and valid cells), ``forward_encoder`` (nothing: the encoder is the
neck), ``pre_decoder`` (query selection among each image's cells and, in
training, the denoising groups) and ``forward_decoder``; the head's parts
are RT-DETR's, not DINO's (see ``RTDETRHead``).

Padding: mmdet pads a batch bottom/right. The neck gets the pixel mask
(``padding_mask``, True on padding, as ``padding_aware.py`` builds it);
each image's boxes are normalised to its ``img_shape``; the anchors of an
image are laid over its own extent and its cells whose centre is in the
padding are invalid anchors; the cross-attention samples the padded maps
at the image's boxes scaled by its valid ratio and reads zeros from padded
cells. So an image padded alone to the batch's shape gives what it gives
inside the batch, and an unpadded image what the released code gives.
"""
import inspect
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from mmdet.models.detectors import DetectionTransformer
from mmdet.registry import MODELS
from mmdet.structures import OptSampleList, SampleList
from torch import Tensor

from ..utils.padding_mask import padding_mask_from_samples


def valid_cells(valid_ratios: Tensor,
                spatial_shapes: Sequence[Tuple[int, int]]) -> Tensor:
    """``(B, L)`` bool, True on the cells whose first pixel is inside the
    image: a cell ``j`` of a ``w``-wide level is valid while ``j / w <
    r_x`` (likewise rows).

    Args:
        valid_ratios (Tensor): ``(B, 2)`` each image's ``(width, height)``
            over the padded input's.
        spatial_shapes (sequence[tuple[int, int]]): per level.
    """
    masks = []
    for h, w in spatial_shapes:
        # a 1e-4 cell past each start: a cell starting exactly at the
        # image's edge stays out whatever the ratio's rounding (starts and
        # edges are whole pixels apart: >= 1 / W >> 1e-4 / w)
        xs = (torch.arange(w, device=valid_ratios.device) + 1e-4) / w
        ys = (torch.arange(h, device=valid_ratios.device) + 1e-4) / h
        col = xs[None] < valid_ratios[:, :1]  # (B, w)
        row = ys[None] < valid_ratios[:, 1:]  # (B, h)
        masks.append((row[:, :, None] & col[:, None, :]).flatten(1))
    return torch.cat(masks, 1)


@MODELS.register_module()
class RTDETR(DetectionTransformer):
    """RT-DETR (v2): ``backbone -> neck(feats, padding_mask=...) ->
    bbox_head``. Its ``loss`` / ``predict`` / ``_forward`` are mmdet's with
    the samples handed to ``extract_feat`` (for the mask).

    Args:
        backbone (dict): e.g. ``ResNetV1d``.
        neck (dict): an encoder taking ``padding_mask``, e.g.
            ``RTDETRHybridEncoder``.
        bbox_head (dict): ``RTDETRHead``.
        train_cfg, test_cfg (dict, optional): passed to the head.
        data_preprocessor (dict, optional), init_cfg (dict, optional).
    """

    def __init__(self,
                 backbone: dict,
                 neck: dict,
                 bbox_head: dict,
                 train_cfg: Optional[dict] = None,
                 test_cfg: Optional[dict] = None,
                 data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(
            backbone=backbone,
            neck=neck,
            bbox_head=bbox_head,
            train_cfg=train_cfg,
            test_cfg=test_cfg,
            data_preprocessor=data_preprocessor,
            init_cfg=init_cfg)
        params = inspect.signature(self.neck.forward).parameters
        if 'padding_mask' not in params:
            raise ValueError(
                f'RTDETR: neck {type(self.neck).__name__} takes no '
                '`padding_mask`; use an encoder that does '
                '(RTDETRHybridEncoder)')

    def _init_layers(self) -> None:
        """Nothing beyond backbone, neck and head: the head owns the
        decoder side."""

    def extract_feat(self,
                     batch_inputs: Tensor,
                     batch_data_samples: OptSampleList = None
                     ) -> Tuple[Tensor, ...]:
        """Backbone, then the neck told the padding (None without
        samples or when no image is padded: the released computation)."""
        mask = None
        size = tuple(batch_inputs.shape[-2:])
        # decided on the samples' metadata, never on tensor values
        if batch_data_samples and any(
                tuple(s.metainfo.get('img_shape', ())[:2]) != size
                for s in batch_data_samples):
            mask = padding_mask_from_samples(batch_data_samples,
                                             batch_inputs)
        return tuple(self.neck(self.backbone(batch_inputs),
                               padding_mask=mask))

    def loss(self, batch_inputs: Tensor,
             batch_data_samples: SampleList) -> Dict[str, Tensor]:
        feats = self.extract_feat(batch_inputs, batch_data_samples)
        head_inputs = self.forward_transformer(feats, batch_data_samples,
                                               batch_inputs.shape[-2:])
        return self.bbox_head.loss(
            **head_inputs, batch_data_samples=batch_data_samples)

    def predict(self,
                batch_inputs: Tensor,
                batch_data_samples: SampleList,
                rescale: bool = True) -> SampleList:
        feats = self.extract_feat(batch_inputs, batch_data_samples)
        head_inputs = self.forward_transformer(feats, batch_data_samples,
                                               batch_inputs.shape[-2:])
        results = self.bbox_head.predict(
            **head_inputs,
            rescale=rescale,
            batch_data_samples=batch_data_samples)
        return self.add_pred_to_datasample(batch_data_samples, results)

    def _forward(self,
                 batch_inputs: Tensor,
                 batch_data_samples: OptSampleList = None
                 ) -> Tuple[Tensor, Tensor]:
        feats = self.extract_feat(batch_inputs, batch_data_samples)
        head_inputs = self.forward_transformer(feats, batch_data_samples,
                                               batch_inputs.shape[-2:])
        return self.bbox_head.forward(**head_inputs)

    def forward_transformer(self,
                            img_feats: Tuple[Tensor, ...],
                            batch_data_samples: OptSampleList = None,
                            input_shape: Optional[Tuple[int, int]] = None
                            ) -> Dict:
        """``pre_transformer -> forward_encoder -> pre_decoder ->
        forward_decoder`` (mmdet's DINO passes the samples on, too).

        Args:
            img_feats (tuple[Tensor]): the neck's maps.
            batch_data_samples (list[DetDataSample], optional): their
                ``img_shape`` / ``batch_input_shape``, and in training the
                ground truth. None: no padding, no denoising.
            input_shape (tuple[int, int], optional): the padded input's
                ``(H, W)``; defaults to the samples' ``batch_input_shape``.

        Returns:
            dict: the head's inputs (``all_logits``, ``all_boxes``,
            ``enc_logits``, ``enc_boxes``, ``dn``).
        """
        enc_in, dec_in = self.pre_transformer(img_feats, batch_data_samples,
                                              input_shape)
        enc_out = self.forward_encoder(**enc_in)
        tmp_dec_in, head_inputs = self.pre_decoder(
            **enc_out, batch_data_samples=batch_data_samples)
        dec_in.update(tmp_dec_in)
        head_inputs.update(self.forward_decoder(**dec_in))
        return head_inputs

    def pre_transformer(self,
                        img_feats: Tuple[Tensor, ...],
                        batch_data_samples: OptSampleList = None,
                        input_shape: Optional[Tuple[int, int]] = None
                        ) -> Tuple[Dict, Dict]:
        """The memory, the levels' shapes, each image's valid ratios
        ``(B, 2)`` and valid cells ``(B, L)`` (both None without
        samples or without padding)."""
        memory, shapes = self.bbox_head.flatten_levels(img_feats)
        ratios = self._valid_ratios(batch_data_samples, input_shape,
                                    memory.device)
        mask = None if ratios is None else valid_cells(ratios, shapes)
        enc_in = dict(feat=memory, spatial_shapes=shapes, valid_ratios=ratios,
                      memory_mask=mask)
        dec_in = dict(spatial_shapes=shapes, memory_mask=mask,
                      valid_ratios=ratios)
        return enc_in, dec_in

    @staticmethod
    def _valid_ratios(samples: OptSampleList,
                      input_shape: Optional[Tuple[int, int]],
                      device: torch.device) -> Optional[Tensor]:
        if not samples:
            return None
        if input_shape is None:
            input_shape = samples[0].metainfo.get('batch_input_shape')
        if input_shape is None:
            return None
        H, W = input_shape
        sizes = [s.metainfo.get('img_shape', (H, W))[:2] for s in samples]
        if all(tuple(s) == (H, W) for s in sizes):
            return None  # no padding: the released computation, exactly
        return torch.tensor([[w / W, h / H] for h, w in sizes],
                            dtype=torch.float32,
                            device=device)

    def forward_encoder(self, feat: Tensor, spatial_shapes: List,
                        valid_ratios: Optional[Tensor],
                        memory_mask: Optional[Tensor]) -> Dict:
        """Nothing to do: the hybrid encoder is the neck."""
        return dict(memory=feat, spatial_shapes=spatial_shapes,
                    valid_ratios=valid_ratios, memory_mask=memory_mask)

    def pre_decoder(self,
                    memory: Tensor,
                    spatial_shapes: List,
                    valid_ratios: Optional[Tensor],
                    memory_mask: Optional[Tensor] = None,
                    batch_data_samples: OptSampleList = None
                    ) -> Tuple[Dict, Dict]:
        """Query selection (among each image's cells) and, in training,
        the denoising queries in front of them."""
        head = self.bbox_head
        query, ref_unact, enc_logits, enc_boxes = head.select_queries(
            memory, spatial_shapes, valid_ratios, memory_mask)
        dn = head.denoising_groups(batch_data_samples) if (
            self.training and batch_data_samples) else None
        attn_mask = None
        if dn is not None:
            query = torch.cat([dn.content, query], 1)
            ref_unact = torch.cat([dn.boxes_unact, ref_unact], 1)
            attn_mask = dn.attn_mask
        dec_in = dict(query=query, ref_unact=ref_unact, memory=memory,
                      attn_mask=attn_mask)
        head_inputs = dict(enc_logits=enc_logits, enc_boxes=enc_boxes, dn=dn)
        return dec_in, head_inputs

    def forward_decoder(self, query: Tensor, ref_unact: Tensor,
                        memory: Tensor, spatial_shapes: List,
                        attn_mask: Optional[Tensor],
                        memory_mask: Optional[Tensor],
                        valid_ratios: Optional[Tensor]) -> Dict:
        """The decoder with the head's per-layer branches."""
        head = self.bbox_head
        boxes, logits = head.decoder(
            query, ref_unact, memory, spatial_shapes, head.dec_bbox_head,
            head.dec_score_head, head.query_pos_head, attn_mask,
            memory_mask, valid_ratios)
        return dict(all_logits=logits, all_boxes=boxes)
