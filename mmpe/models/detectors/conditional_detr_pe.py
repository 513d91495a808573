"""Conditional DETR with a position encoding (iRPE, RoPE-2D, RoPE-Mixed or
none) in every encoder self-attention layer.

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
from .encoder_pe_mixin import PEEncoderMixin


# 'iRPEConditionalDETR': the registry name before the rename (configs)
@MODELS.register_module(name=['PEConditionalDETR', 'iRPEConditionalDETR'])
class PEConditionalDETR(DecoderPEMixin, PEEncoderMixin, ConditionalDETR):
    """Conditional DETR whose encoder self-attention layers carry a
    position encoding (``encoder_pe``: iRPE, RoPE-2D, RoPE-Mixed or none).

    Same arguments as mmdet's :class:`~mmdet.models.ConditionalDETR`, with
    ``encoder.layer_cfg.self_attn_cfg`` taking ``rpe_cfg``, ``rpe_on`` and
    ``attn_impl``, and ``positional_encoding=None`` for no sine encoding
    (see :class:`PEEncoderMixin`). A ConditionalDETR state dict loads with
    only the RPE tables missing; with zero tables the outputs are
    ConditionalDETR's.

    ``decoder_pe`` puts the box-to-pixel relative position bias into the
    decoder's cross-attention (:class:`DecoderPEMixin`); None (the
    default) keeps mmdet's decoder.
    """
