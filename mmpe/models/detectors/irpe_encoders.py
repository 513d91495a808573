"""DETR-family encoders whose self-attention is :class:`iRPEMultiheadAttention`.

The encoders of DETR, Conditional DETR (the same class) and DAB-DETR stack
mmdet's plain :class:`~mmdet.models.layers.DetrTransformerEncoderLayer`;
here each layer's mmcv ``MultiheadAttention`` is replaced by
:class:`~mmpe.models.layers.iRPEMultiheadAttention`, which has the same
parameter names (plain checkpoints load with only the ``rpe_*.table``
entries missing) and adds the iRPE terms of Wu et al., ICCV 2021, Eq. 13-17.
The token grid reaches every attention as the keyword ``spatial_shape``
through the encoders' and layers' ``**kwargs``.
"""
from typing import Dict

from mmengine.model import ModuleList

from mmdet.models.layers import (DABDetrTransformerEncoder,
                                 DetrTransformerEncoder,
                                 DetrTransformerEncoderLayer)
from mmdet.models.layers.transformer.utils import MLP
from ..layers.blocks.irpe_attention import iRPEMultiheadAttention

#: The arguments iRPEMultiheadAttention takes beyond mmcv's attention.
IRPE_ATTN_KEYS = ('rpe_cfg', 'rpe_on', 'attn_impl', 'chunk_size',
                  'rope_cfg')


def without_irpe(attn_cfg: Dict) -> Dict:
    """An attention config without mmpe's arguments, for the mmcv attention
    that mmdet builds before mmpe swaps it out."""
    return {k: v for k, v in attn_cfg.items() if k not in IRPE_ATTN_KEYS}


def encoder_without_irpe(encoder_cfg: Dict) -> Dict:
    """An encoder config whose self-attention config is
    :func:`without_irpe`'s, for the plain encoder a detector builds."""
    layer_cfg = encoder_cfg['layer_cfg']
    return dict(
        encoder_cfg,
        layer_cfg=dict(
            layer_cfg,
            self_attn_cfg=without_irpe(layer_cfg['self_attn_cfg'])))


class iRPEDetrTransformerEncoderLayer(DetrTransformerEncoderLayer):
    """DETR encoder layer whose self-attention is
    :class:`iRPEMultiheadAttention`.

    ``self_attn_cfg`` takes iRPEMultiheadAttention's arguments (``rpe_cfg``,
    ``rpe_on``, ``attn_impl`` besides mmcv's); the token grid reaches the
    attention as the keyword ``spatial_shape`` through the layer's
    ``**kwargs``.
    """

    def _init_layers(self) -> None:
        # mmdet's layer (its attention built without mmpe's arguments),
        # then iRPEMultiheadAttention in place of mmcv's: same parameter
        # names, so plain state dicts load
        cfg = self.self_attn_cfg
        self.self_attn_cfg = without_irpe(cfg)
        super()._init_layers()
        self.self_attn_cfg = cfg
        self.self_attn = iRPEMultiheadAttention(**cfg)


class iRPEEncoderLayersMixin:
    """Builds an encoder's ``layers`` from
    :class:`iRPEDetrTransformerEncoderLayer` (for subclasses of mmdet's
    :class:`DetrTransformerEncoder`)."""

    def _init_irpe_layers(self) -> None:
        if self.num_cp > 0:
            raise ValueError(
                f'`num_cp` (activation checkpointing) is not supported by '
                f'the iRPE encoder, got {self.num_cp}; use 0 or -1')
        self.layers = ModuleList([
            iRPEDetrTransformerEncoderLayer(**self.layer_cfg)
            for _ in range(self.num_layers)
        ])
        self.embed_dims = self.layers[0].embed_dims


class iRPEDetrTransformerEncoder(iRPEEncoderLayersMixin,
                                 DetrTransformerEncoder):
    """Encoder of DETR and Conditional DETR made of
    :class:`iRPEDetrTransformerEncoderLayer`."""

    def _init_layers(self) -> None:
        self._init_irpe_layers()


class iRPEDABDetrTransformerEncoder(iRPEEncoderLayersMixin,
                                    DABDetrTransformerEncoder):
    """Encoder of DAB-DETR made of :class:`iRPEDetrTransformerEncoderLayer`.

    mmdet's forward is kept: before each layer, the absolute encoding is
    scaled by ``query_scale(query)`` (DAB-DETR's per-token MLP), and the
    layer's keyword arguments (``spatial_shape``) are passed through.
    """

    def _init_layers(self) -> None:
        # the layers, then DAB-DETR's scale MLP, in mmdet's order
        self._init_irpe_layers()
        self.query_scale = MLP(self.embed_dims, self.embed_dims,
                               self.embed_dims, 2)
