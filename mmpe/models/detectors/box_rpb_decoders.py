"""DAB-DETR's and Conditional DETR's decoders with the box-to-pixel relative
position bias (BoxRPB) in every cross-attention.

Lin et al., "DETR Doesn't Need Multi-Scale or Locality Design" (ICCV 2023,
Sec. 3.2): each decoder layer's cross-attention logits get
``B_h[q, (jy, jx)] = MLP^x(dx)_h + MLP^y(dy)_h`` from the offsets between
the query's reference box (or point) and the key pixel centres
(:class:`~mmpe.models.layers.BoxRPB`). In DAB-DETR the bias of layer ``l``
is driven by the anchor boxes that layer reads (the refined boxes of layer
``l - 1``, the learned anchors in the first layer); in Conditional DETR by
its reference points (the same in every layer). Everything else is
mmdet's decoder, step for step; the cross-attentions become
:class:`~mmpe.models.layers.attention.cross.BiasedConditionalAttention`
(same parameters), and the MLPs are ``decoder.box_rpb.<i>`` (one pair per
layer, or one shared).
"""
from typing import Dict, List, Optional, Sequence

import torch
from mmdet.models.layers.transformer import (
    ConditionalDetrTransformerDecoder, DABDetrTransformerDecoder)
from mmdet.models.layers.transformer.utils import (coordinate_to_encoding,
                                                   inverse_sigmoid)
from mmengine.model import ModuleList
from torch import Tensor, nn

from ..layers.attention.cross import BiasedConditionalAttention
from ..layers.box.box_rpb import AxisBiasTerm, BoxRPB


class BoxRPBDecoderMixin:
    """Shared by both decoders: the biased cross-attentions, the MLPs, a
    layer's forward with its term.

    ``decoder_pe`` (keyword of ``__init__``) is the parsed setting
    (:func:`~mmpe.models.detectors.decoder_pe.parse_decoder_pe`).
    """

    def __init__(self, *args, decoder_pe: Dict, **kwargs) -> None:
        self.decoder_pe = dict(decoder_pe)
        super().__init__(*args, **kwargs)

    def _init_layers(self) -> None:
        super()._init_layers()
        cfg = self.decoder_pe
        for layer in self.layers:
            biased = BiasedConditionalAttention(
                **layer.cross_attn_cfg,
                attn_impl=cfg['attn_impl'],
                chunk_size=cfg['chunk_size'])
            if layer.cross_attn.qpos_proj is None:  # mmdet's layers > 0
                biased.qpos_proj = None
            layer.cross_attn = biased
        heads = self.layers[0].cross_attn.num_heads
        self.box_rpb = ModuleList([
            BoxRPB(
                heads,
                mode=cfg['mode'],
                hidden=cfg['hidden'],
                offsets=cfg['offsets'],
                stride=cfg['stride'])
            for _ in range(1 if cfg['shared'] else self.num_layers)
        ])

    def reset_box_rpb(self) -> None:
        """Plain-DETR's initialisation of the MLPs."""
        for rpb in self.box_rpb:
            rpb.reset_parameters()

    def rpb_term(self, layer_id: int, refs: Tensor,
                 key_padding_mask: Optional[Tensor],
                 spatial_shape: Sequence[int]) -> AxisBiasTerm:
        """The bias term of one layer for references (bs, nq, 4 or 2)."""
        if spatial_shape is None:
            raise ValueError(
                f'{type(self).__name__} needs `spatial_shape=(h, w)` of the '
                'memory (the detector puts it into the decoder inputs)')
        rpb = self.box_rpb[0 if len(self.box_rpb) == 1 else layer_id]
        return rpb.term(refs, key_padding_mask, *spatial_shape)

    @staticmethod
    def layer_forward(layer: nn.Module, query: Tensor, key: Tensor,
                      query_pos: Tensor, key_pos: Tensor,
                      ref_sine_embed: Tensor,
                      key_padding_mask: Optional[Tensor], is_first: bool,
                      spatial_shape: Sequence[int],
                      term: AxisBiasTerm) -> Tensor:
        """mmdet's decoder layer (self-attention, norm, cross-attention,
        norm, FFN, norm) with ``term`` in the cross-attention."""
        query = layer.self_attn(
            query=query, key=query, query_pos=query_pos, key_pos=query_pos)
        query = layer.norms[0](query)
        query = layer.cross_attn(
            query=query,
            key=key,
            query_pos=query_pos,
            key_pos=key_pos,
            ref_sine_embed=ref_sine_embed,
            key_padding_mask=key_padding_mask,
            is_first=is_first,
            spatial_shape=spatial_shape,
            terms=[term])
        query = layer.norms[1](query)
        query = layer.ffn(query)
        return layer.norms[2](query)


class BoxRPBDABDecoder(BoxRPBDecoderMixin, DABDetrTransformerDecoder):
    """DAB-DETR's decoder with BoxRPB; the bias of each layer comes from
    the anchor boxes it reads (``query_dim=4``; ``'point-rpb'`` reads their
    centres)."""

    def forward(self,
                query: Tensor,
                key: Tensor,
                query_pos: Tensor,
                key_pos: Tensor,
                reg_branches: nn.Module,
                key_padding_mask: Optional[Tensor] = None,
                spatial_shape: Optional[Sequence[int]] = None,
                **kwargs) -> List[Tensor]:
        """mmdet's forward with the bias; ``spatial_shape`` is the memory
        grid ``(h, w)``. Returns what mmdet's returns."""
        output = query
        reference_points = query_pos.sigmoid()
        intermediate_reference_points = [reference_points]
        intermediate = []
        half = self.embed_dims // 2
        for layer_id, layer in enumerate(self.layers):
            obj_center = reference_points[..., :self.query_dim]
            ref_sine_embed = coordinate_to_encoding(
                coord_tensor=obj_center, num_feats=half)
            query_pos = self.ref_point_head(ref_sine_embed)
            if self.query_scale_type != 'fix_elewise':
                pos_transformation = 1 if layer_id == 0 else \
                    self.query_scale(output)
            else:
                pos_transformation = self.query_scale.weight[layer_id]
            ref_sine_embed = ref_sine_embed[
                ..., :self.embed_dims] * pos_transformation
            if self.with_modulated_hw_attn:
                ref_hw = self.ref_anchor_head(output).sigmoid()
                ref_sine_embed[..., half:] *= \
                    (ref_hw[..., 0] / obj_center[..., 2]).unsqueeze(-1)
                ref_sine_embed[..., :half] *= \
                    (ref_hw[..., 1] / obj_center[..., 3]).unsqueeze(-1)
            term = self.rpb_term(layer_id, obj_center, key_padding_mask,
                                 spatial_shape)
            output = self.layer_forward(layer, output, key, query_pos,
                                        key_pos, ref_sine_embed,
                                        key_padding_mask, layer_id == 0,
                                        spatial_shape, term)
            tmp_reg_preds = reg_branches(output)
            tmp_reg_preds[..., :self.query_dim] += inverse_sigmoid(
                reference_points)
            new_reference_points = tmp_reg_preds[
                ..., :self.query_dim].sigmoid()
            if layer_id != self.num_layers - 1:
                intermediate_reference_points.append(new_reference_points)
            reference_points = new_reference_points.detach()
            if self.return_intermediate:
                intermediate.append(self.post_norm(output))
        output = self.post_norm(output)
        if self.return_intermediate:
            return [
                torch.stack(intermediate),
                torch.stack(intermediate_reference_points)
            ]
        return [
            output.unsqueeze(0),
            torch.stack(intermediate_reference_points)
        ]


class BoxRPBConditionalDecoder(BoxRPBDecoderMixin,
                               ConditionalDetrTransformerDecoder):
    """Conditional DETR's decoder with the point variant of BoxRPB
    (``'point-rpb'``): one offset per axis from its reference points."""

    def forward(self,
                query: Tensor,
                key: Tensor = None,
                query_pos: Tensor = None,
                key_pos: Tensor = None,
                key_padding_mask: Tensor = None,
                spatial_shape: Optional[Sequence[int]] = None):
        """mmdet's forward with the bias; ``spatial_shape`` is the memory
        grid ``(h, w)``. Returns what mmdet's returns."""
        reference = self.ref_point_head(query_pos).sigmoid()
        reference_xy = reference[..., :2]
        intermediate = []
        term = None
        for layer_id, layer in enumerate(self.layers):
            pos_transformation = 1 if layer_id == 0 else \
                self.query_scale(query)
            ref_sine_embed = coordinate_to_encoding(coord_tensor=reference_xy)
            ref_sine_embed = ref_sine_embed * pos_transformation
            if term is None or len(self.box_rpb) > 1:
                # the points are the same in every layer
                term = self.rpb_term(layer_id, reference_xy,
                                     key_padding_mask, spatial_shape)
            query = self.layer_forward(layer, query, key, query_pos, key_pos,
                                       ref_sine_embed, key_padding_mask,
                                       layer_id == 0, spatial_shape, term)
            if self.return_intermediate:
                intermediate.append(self.post_norm(query))
        if self.return_intermediate:
            return torch.stack(intermediate), reference
        query = self.post_norm(query)
        return query.unsqueeze(0), reference
