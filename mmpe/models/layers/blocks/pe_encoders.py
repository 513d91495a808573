"""DETR-family encoders whose self-attention is :class:`PEMultiheadAttention`.

The encoders of DETR, Conditional DETR (the same class) and DAB-DETR stack
mmdet's plain :class:`~mmdet.models.layers.DetrTransformerEncoderLayer`;
here each layer's mmcv ``MultiheadAttention`` is replaced by
:class:`~mmpe.models.layers.PEMultiheadAttention`, which has the same
parameter names (plain checkpoints load with only the ``rpe_*.table``
entries missing) and adds the iRPE terms of Wu et al., ICCV 2021, Eq. 13-17,
or rotates queries and keys with 2D RoPE, or adds nothing.
The token grid reaches every attention as the keyword ``spatial_shape``
through the encoders' and layers' ``**kwargs``.
"""
from typing import Dict

from mmengine.model import ModuleList

from mmdet.models.layers import (DABDetrTransformerEncoder,
                                 DetrTransformerEncoder,
                                 DetrTransformerEncoderLayer)
from mmdet.models.layers.transformer.utils import MLP
from ..grid_bias.build import layer_bias_cfg
from .multihead_attention import PEMultiheadAttention

#: The arguments PEMultiheadAttention takes beyond mmcv's attention.
PE_ATTN_KEYS = ('rpe_cfg', 'rpe_on', 'attn_impl', 'chunk_size', 'rope_cfg',
                'bias_cfg')


def without_pe_args(attn_cfg: Dict) -> Dict:
    """An attention config without mmpe's arguments, for the mmcv attention
    that mmdet builds before mmpe swaps it out."""
    return {k: v for k, v in attn_cfg.items() if k not in PE_ATTN_KEYS}


def encoder_without_pe_args(encoder_cfg: Dict) -> Dict:
    """An encoder config whose self-attention config is
    :func:`without_pe_args`'s, for the plain encoder a detector builds."""
    layer_cfg = encoder_cfg['layer_cfg']
    return dict(
        encoder_cfg,
        layer_cfg=dict(
            layer_cfg,
            self_attn_cfg=without_pe_args(layer_cfg['self_attn_cfg'])))


class PEDetrTransformerEncoderLayer(DetrTransformerEncoderLayer):
    """DETR encoder layer whose self-attention is
    :class:`PEMultiheadAttention`.

    ``self_attn_cfg`` takes PEMultiheadAttention's arguments (``rpe_cfg``,
    ``rpe_on``, ``attn_impl`` besides mmcv's); the token grid reaches the
    attention as the keyword ``spatial_shape`` through the layer's
    ``**kwargs``.
    """

    def _init_layers(self) -> None:
        # mmdet's layer (its attention built without mmpe's arguments),
        # then PEMultiheadAttention in place of mmcv's: same parameter
        # names, so plain state dicts load
        cfg = self.self_attn_cfg
        self.self_attn_cfg = without_pe_args(cfg)
        super()._init_layers()
        self.self_attn_cfg = cfg
        self.self_attn = PEMultiheadAttention(**cfg)


class PEEncoderLayersMixin:
    """Builds an encoder's ``layers`` from
    :class:`PEDetrTransformerEncoderLayer` (for subclasses of mmdet's
    :class:`DetrTransformerEncoder`)."""

    def _init_pe_layers(self) -> None:
        if self.num_cp > 0:
            raise ValueError(
                f'`num_cp` (activation checkpointing) is not supported by '
                f'the encoder of mmpe, got {self.num_cp}; use 0 or -1')
        self.layers = ModuleList([
            PEDetrTransformerEncoderLayer(**self._pe_layer_cfg(i))
            for i in range(self.num_layers)
        ])
        self.embed_dims = self.layers[0].embed_dims

    def _pe_layer_cfg(self, index: int) -> Dict:
        """Layer ``index``'s config: LookHere's slope depends on the
        layer (``layer_bias_cfg``), every other setting is shared."""
        attn = self.layer_cfg['self_attn_cfg']
        bias = layer_bias_cfg(attn.get('bias_cfg'), index, self.num_layers)
        if bias is attn.get('bias_cfg'):
            return self.layer_cfg
        return dict(self.layer_cfg, self_attn_cfg=dict(attn, bias_cfg=bias))


class PEDetrTransformerEncoder(PEEncoderLayersMixin, DetrTransformerEncoder):
    """Encoder of DETR and Conditional DETR made of
    :class:`PEDetrTransformerEncoderLayer`."""

    def _init_layers(self) -> None:
        self._init_pe_layers()


class PEDABDetrTransformerEncoder(PEEncoderLayersMixin,
                                  DABDetrTransformerEncoder):
    """Encoder of DAB-DETR made of :class:`PEDetrTransformerEncoderLayer`.

    mmdet's forward is kept: before each layer, the absolute encoding is
    scaled by ``query_scale(query)`` (DAB-DETR's per-token MLP), and the
    layer's keyword arguments (``spatial_shape``) are passed through.
    """

    def _init_layers(self) -> None:
        # the layers, then DAB-DETR's scale MLP, in mmdet's order
        self._init_pe_layers()
        self.query_scale = MLP(self.embed_dims, self.embed_dims,
                               self.embed_dims, 2)
