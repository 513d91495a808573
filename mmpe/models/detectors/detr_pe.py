"""DETR with a position encoding (iRPE, RoPE-2D, RoPE-Mixed or none) in
every encoder self-attention layer.

Wu et al., "Rethinking and Improving Relative Position Encoding for Vision
Transformer" (ICCV 2021), Sec. 4.4 / Tab. 6: relative position encoding goes
into the encoder's self-attention only, on top of (or instead of) DETR's sine
absolute encoding; the decoder is unchanged.
"""
from mmdet.models.detectors import DETR
from mmdet.registry import MODELS
from .encoder_pe_mixin import PEEncoderMixin


# 'iRPEDETR': the registry name of releases before the rename (configs)
@MODELS.register_module(name=['PEDETR', 'iRPEDETR'])
class PEDETR(PEEncoderMixin, DETR):
    """DETR whose encoder self-attention layers carry a position encoding
    (``encoder_pe``: iRPE, RoPE-2D, RoPE-Mixed or none).

    Same arguments as mmdet's :class:`~mmdet.models.DETR`, and those of
    :class:`PEEncoderMixin`:

    - ``encoder.layer_cfg.self_attn_cfg`` accepts ``rpe_cfg`` (arguments of
      :class:`~mmpe.models.layers.iRPE`), ``rpe_on`` and ``attn_impl``;
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
