"""Conditional DETR with iRPE in every encoder self-attention layer.

Meng et al., "Conditional DETR for Fast Training Convergence" (ICCV 2021)
keeps DETR's encoder (plain multi-head self-attention over the flattened
feature map); the iRPE terms of Wu et al. (ICCV 2021, Eq. 13-17) go there,
as the iRPE paper does for DETR (Sec. 4.4). The conditional decoder is
mmdet's, unchanged unless ``decoder_pe`` adds the point variant of the
box-to-pixel relative position bias (Lin et al., ICCV 2023).
"""
from mmdet.models.detectors import ConditionalDETR
from mmdet.registry import MODELS
from .decoder_pe_mixin import DecoderPEMixin
from .irpe_encoder_mixin import iRPEEncoderMixin


@MODELS.register_module()
class iRPEConditionalDETR(DecoderPEMixin, iRPEEncoderMixin, ConditionalDETR):
    """Conditional DETR whose encoder self-attention layers use iRPE.

    Same arguments as mmdet's :class:`~mmdet.models.ConditionalDETR`, with
    ``encoder.layer_cfg.self_attn_cfg`` taking ``rpe_cfg``, ``rpe_on`` and
    ``attn_impl``, and ``positional_encoding=None`` for no sine encoding
    (see :class:`iRPEEncoderMixin`). A ConditionalDETR state dict loads with
    only the RPE tables missing; with zero tables the outputs are
    ConditionalDETR's.

    ``decoder_pe`` puts the box-to-pixel relative position bias into the
    decoder's cross-attention (:class:`DecoderPEMixin`); None (the
    default) keeps mmdet's decoder.
    """
