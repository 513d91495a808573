"""DETR with iRPE in every encoder self-attention layer.

Wu et al., "Rethinking and Improving Relative Position Encoding for Vision
Transformer" (ICCV 2021), Sec. 4.4 / Tab. 6: relative position encoding goes
into the encoder's self-attention only, on top of (or instead of) DETR's sine
absolute encoding; the decoder is unchanged.
"""
from typing import Dict, Optional, Tuple

import torch
from mmengine.model import ModuleList
from torch import Tensor

from mmdet.models.detectors import DETR
from mmdet.models.layers import (DetrTransformerEncoder,
                                 DetrTransformerEncoderLayer)
from mmdet.registry import MODELS
from mmdet.structures import OptSampleList
from ..layers.irpe import iRPE
from ..layers.irpe_attention import iRPEMultiheadAttention


def _without_irpe(attn_cfg: Dict) -> Dict:
    """An attention config without mmpe's arguments, for mmcv's attention
    that mmdet builds before mmpe swaps it out."""
    return {
        k: v
        for k, v in attn_cfg.items()
        if k not in ('rpe_cfg', 'rpe_on', 'attn_impl')
    }


class iRPEDetrTransformerEncoderLayer(DetrTransformerEncoderLayer):
    """DETR encoder layer whose self-attention is
    :class:`iRPEMultiheadAttention`.

    ``self_attn_cfg`` takes iRPEMultiheadAttention's arguments (``rpe_cfg``,
    ``rpe_on`` besides mmcv's); the token grid reaches the attention as the
    keyword ``spatial_shape`` through the layer's ``**kwargs``.
    """

    def _init_layers(self) -> None:
        # mmdet's layer (its attention built without mmpe's arguments),
        # then iRPEMultiheadAttention in place of mmcv's: same parameter
        # names, so plain DETR state dicts load
        cfg = self.self_attn_cfg
        self.self_attn_cfg = _without_irpe(cfg)
        super()._init_layers()
        self.self_attn_cfg = cfg
        self.self_attn = iRPEMultiheadAttention(**cfg)


class iRPEDetrTransformerEncoder(DetrTransformerEncoder):
    """DETR encoder made of :class:`iRPEDetrTransformerEncoderLayer`."""

    def _init_layers(self) -> None:
        if self.num_cp > 0:
            raise ValueError(
                f'`num_cp` (activation checkpointing) is not supported by '
                f'the iRPE encoder, got {self.num_cp}; use 0 or -1')
        self.layers = ModuleList([
            iRPEDetrTransformerEncoderLayer(**self.layer_cfg)
            for _ in range(self.num_layers)
        ])
        self.embed_dims = self.layers[0].embed_dims


@MODELS.register_module()
class iRPEDETR(DETR):
    """DETR whose encoder self-attention layers use iRPE.

    Same arguments as mmdet's :class:`~mmdet.models.DETR`, and:

    - ``encoder.layer_cfg.self_attn_cfg`` accepts ``rpe_cfg`` (arguments of
      :class:`~mmpe.models.layers.iRPE`) and ``rpe_on``;
    - ``positional_encoding=None`` removes DETR's sine absolute encoding from
      encoder and decoder (the paper's "no abs PE" rows); it is replaced by
      zeros so that mmdet's layers need no change.
    - the RPE tables are initialised as ``rpe_cfg['init']`` says
      (``'zeros'``, the paper's Sec. 4.1 default, or ``'xavier'``, what the
      authors' DETR code ends up doing since DETR Xavier-initialises every
      encoder matrix), after DETR's own initialisation.

    For each batch, the padded feature map's grid (h, w) is handed to every
    encoder self-attention as ``spatial_shape``; images of different sizes
    are padded bottom/right by mmdet, so their pixel coordinates, and with
    them the relative positions, are those of the unpadded image, and padded
    keys stay masked by ``key_padding_mask``.
    """

    def __init__(self,
                 *args,
                 positional_encoding: Optional[Dict] = None,
                 **kwargs) -> None:
        self.use_abs_pe = positional_encoding is not None
        if positional_encoding is None:
            # Built (it holds no parameters) but its output is replaced by 0.
            num_feats = kwargs['encoder']['layer_cfg']['self_attn_cfg'][
                'embed_dims'] // 2
            positional_encoding = dict(num_feats=num_feats, normalize=True)
        super().__init__(
            *args, positional_encoding=positional_encoding, **kwargs)

    def _init_layers(self) -> None:
        # mmdet's DETR, then the iRPE encoder in place of its encoder
        encoder_cfg = self.encoder
        encoder = iRPEDetrTransformerEncoder(**encoder_cfg)
        self.encoder = dict(
            encoder_cfg,
            layer_cfg=dict(
                encoder_cfg['layer_cfg'],
                self_attn_cfg=_without_irpe(
                    encoder_cfg['layer_cfg']['self_attn_cfg'])))
        super()._init_layers()
        self.encoder = encoder
        num_feats = self.positional_encoding.num_feats
        if num_feats * 2 != self.embed_dims:
            raise ValueError(
                f'`positional_encoding.num_feats` ({num_feats}) must be half '
                f'of the encoder\'s embed_dims ({self.embed_dims})')

    def init_weights(self) -> None:
        """DETR's init (Xavier on every encoder matrix), then each RPE
        table as its own ``init`` says."""
        super().init_weights()
        for module in self.encoder.modules():
            if isinstance(module, iRPE):
                module.reset_table()

    def pre_transformer(
            self,
            img_feats: Tuple[Tensor],
            batch_data_samples: OptSampleList = None) -> Tuple[Dict, Dict]:
        """DETR's inputs plus the encoder's token grid.

        Returns:
            tuple[dict, dict]: encoder inputs (``feat``, ``feat_mask``,
            ``feat_pos``, ``spatial_shape``) and decoder inputs
            (``memory_mask``, ``memory_pos``).
        """
        encoder_inputs_dict, decoder_inputs_dict = super().pre_transformer(
            img_feats, batch_data_samples)
        height, width = img_feats[-1].shape[-2:]
        encoder_inputs_dict['spatial_shape'] = (int(height), int(width))
        if not self.use_abs_pe:
            pos = torch.zeros_like(encoder_inputs_dict['feat_pos'])
            encoder_inputs_dict['feat_pos'] = pos
            decoder_inputs_dict['memory_pos'] = pos
        return encoder_inputs_dict, decoder_inputs_dict

    def forward_encoder(self, feat: Tensor, feat_mask: Tensor,
                        feat_pos: Tensor, spatial_shape: Tuple[int,
                                                               int]) -> Dict:
        """Encoder forward; every self-attention gets ``spatial_shape``.

        Args:
            feat (Tensor): (bs, h * w, dim) flattened features.
            feat_mask (Tensor): (bs, h * w) padding mask, or None.
            feat_pos (Tensor): (bs, h * w, dim) absolute encoding.
            spatial_shape (tuple[int, int]): Feature grid (h, w).

        Returns:
            dict: ``memory`` of shape (bs, h * w, dim).
        """
        memory = self.encoder(
            query=feat,
            query_pos=feat_pos,
            key_padding_mask=feat_mask,
            spatial_shape=spatial_shape)
        return dict(memory=memory)
