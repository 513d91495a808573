"""iRPE in the encoder self-attention of any DETR-family detector whose encoder
is plain multi-head self-attention (DETR, Conditional DETR, DAB-DETR).

Wu et al., "Rethinking and Improving Relative Position Encoding for Vision
Transformer" (ICCV 2021), Sec. 4.4 / Tab. 6: relative position encoding goes
into the encoder's self-attention only, on top of (or instead of) the sine
absolute encoding; the decoder is unchanged.
"""
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from mmdet.models.detectors import DABDETR, DETR, ConditionalDETR
from mmdet.structures import OptSampleList
from ..layers.irpe import iRPE
from .irpe_encoders import (encoder_without_irpe,
                            iRPEDABDetrTransformerEncoder,
                            iRPEDetrTransformerEncoder)

#: mmdet detector (subclasses first) -> its encoder with iRPE attention.
IRPE_ENCODERS = (
    (DABDETR, iRPEDABDetrTransformerEncoder),
    (ConditionalDETR, iRPEDetrTransformerEncoder),
    (DETR, iRPEDetrTransformerEncoder),
)
SUPPORTED_DETECTORS = tuple(det.__name__ for det, _ in IRPE_ENCODERS)


class iRPEEncoderMixin:
    """Puts iRPE into every encoder self-attention of an mmdet DETR-family
    detector: ``class iRPEConditionalDETR(iRPEEncoderMixin, ConditionalDETR)``.

    What changes against the plain detector:

    - ``encoder.layer_cfg.self_attn_cfg`` accepts ``rpe_cfg`` (arguments of
      :class:`~mmpe.models.layers.iRPE`), ``rpe_on`` and ``attn_impl``; the
      encoder's mmcv attentions become
      :class:`~mmpe.models.layers.iRPEMultiheadAttention` (same parameter
      names: the plain detector's state dict loads with only the
      ``rpe_*.table`` entries missing; zero tables give the plain
      detector's outputs);
    - ``positional_encoding=None`` removes the sine absolute encoding from
      encoder and decoder keys (the paper's "no abs PE" rows); it is
      replaced by zeros so that mmdet's layers need no change;
    - the RPE tables are initialised as ``rpe_cfg['init']`` says, after the
      detector's own initialisation (which Xavier-initialises every encoder
      matrix);
    - ``pre_transformer`` adds the padded feature map's grid
      ``spatial_shape=(h, w)`` to the encoder inputs and
      ``forward_encoder`` hands it to every encoder layer. mmdet pads
      images bottom/right, so each image's token coordinates, and with them
      the relative positions, are those of the unpadded image; padded keys
      stay masked by ``key_padding_mask``.

    Detectors whose encoder is not plain self-attention (Deformable DETR,
    DINO: multi-scale deformable attention) are refused with a ValueError.
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

    def _irpe_encoder_class(self) -> type:
        for detector, encoder in IRPE_ENCODERS:
            if isinstance(self, detector):
                return encoder
        rpe_cfg = self.encoder['layer_cfg']['self_attn_cfg'].get('rpe_cfg')
        raise ValueError(
            f'Unsupported `encoder.layer_cfg.self_attn_cfg.rpe_cfg` '
            f'{rpe_cfg!r} on {type(self).__name__}: relative position '
            f'encoding needs plain multi-head self-attention in the encoder '
            f'(this detector\'s encoder attention is not); please choose '
            f'a detector from {SUPPORTED_DETECTORS}')

    def _init_layers(self) -> None:
        # the iRPE encoder, then the plain detector's layers from a config
        # without mmpe's arguments, its plain encoder replaced
        encoder_cfg = self.encoder
        encoder = self._irpe_encoder_class()(**encoder_cfg)
        self.encoder = encoder_without_irpe(encoder_cfg)
        super()._init_layers()
        # mmdet's forward of the encoder it built is the one that runs
        assert isinstance(encoder, type(self.encoder))
        self.encoder = encoder
        num_feats = self.positional_encoding.num_feats
        if num_feats * 2 != self.embed_dims:
            raise ValueError(
                f'`positional_encoding.num_feats` ({num_feats}) must be half '
                f'of the encoder\'s embed_dims ({self.embed_dims})')

    def init_weights(self) -> None:
        """The detector's init (Xavier on every encoder matrix), then each
        RPE table as its own ``init`` says."""
        super().init_weights()
        for module in self.encoder.modules():
            if isinstance(module, iRPE):
                module.reset_table()

    def pre_transformer(
            self,
            img_feats: Tuple[Tensor],
            batch_data_samples: OptSampleList = None) -> Tuple[Dict, Dict]:
        """The detector's inputs plus the encoder's token grid.

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
