"""DAB-DETR with a position encoding (iRPE, RoPE-2D, RoPE-Mixed or none) in
every encoder self-attention layer.

Liu et al., "DAB-DETR: Dynamic Anchor Boxes are Better Queries for DETR"
(ICLR 2022): the encoder is DETR's plain multi-head self-attention, with the
sine encoding of each token scaled by an MLP of the token before every layer.
The iRPE terms of Wu et al. (ICCV 2021, Eq. 13-17) go into that
self-attention, as the iRPE paper does for DETR (Sec. 4.4); the
anchor-box decoder is mmdet's, unchanged unless ``decoder_pe`` adds the
box-to-pixel relative position bias (Lin et al., ICCV 2023).
"""
from mmdet.models.detectors import DABDETR
from mmdet.registry import MODELS
from .decoder_pe_mixin import DecoderPEMixin
from .encoder_pe_mixin import PEEncoderMixin


# 'iRPEDABDETR': the registry name before the rename (configs)
@MODELS.register_module(name=['PEDABDETR', 'iRPEDABDETR'])
class PEDABDETR(DecoderPEMixin, PEEncoderMixin, DABDETR):
    """DAB-DETR whose encoder self-attention layers carry a position
    encoding (``encoder_pe``: iRPE, RoPE-2D, RoPE-Mixed or none).

    Same arguments as mmdet's :class:`~mmdet.models.DABDETR`, with
    ``encoder.layer_cfg.self_attn_cfg`` taking ``rpe_cfg``, ``rpe_on`` and
    ``attn_impl``, and ``positional_encoding=None`` for no sine encoding
    (see :class:`PEEncoderMixin`); the encoder is
    :class:`PEDABDetrTransformerEncoder` (DAB-DETR's position scaling
    kept). A DABDETR state dict loads with only the RPE tables missing; with
    zero tables the outputs are DABDETR's.

    ``decoder_pe`` puts the box-to-pixel relative position bias into the
    decoder's cross-attention (:class:`DecoderPEMixin`); None (the
    default) keeps mmdet's decoder.
    """
