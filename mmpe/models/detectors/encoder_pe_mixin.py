"""Position encodings (iRPE, RoPE-2D, RoPE-Mixed; sine, learnable or no
absolute part) in the encoder of any DETR-family detector whose encoder is
plain multi-head self-attention (DETR, Conditional DETR, DAB-DETR).

Wu et al., "Rethinking and Improving Relative Position Encoding for Vision
Transformer" (ICCV 2021), Sec. 4.4 / Tab. 6: relative position encoding goes
into the encoder's self-attention only, on top of (or instead of) the sine
absolute encoding; the decoder is unchanged. The one config setting is
``encoder_pe`` (:mod:`.encoder_pe`).
"""
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from mmdet.models.detectors import DABDETR, DETR, ConditionalDETR
from mmdet.models.layers import LearnedPositionalEncoding
from mmdet.structures import OptSampleList
from ..layers.blocks.pe_encoders import (PEDABDetrTransformerEncoder,
                                         PEDetrTransformerEncoder,
                                         encoder_without_pe_args)
from ..layers.encodings.rope_coords import RoPECoords
from ..layers.encodings.rope_mixed import RoPEMixed
from ..layers.grid_bias.log_cpb import LogCPB
from ..layers.irpe.irpe import iRPE
from ..utils.encoder_pe import (attention_pe_cfg, parse_encoder_pe,
                                rope_coords_cfg)

#: mmdet detector (subclasses first) -> its encoder with mmpe's attention.
PE_ENCODERS = (
    (DABDETR, PEDABDetrTransformerEncoder),
    (ConditionalDETR, PEDetrTransformerEncoder),
    (DETR, PEDetrTransformerEncoder),
)
SUPPORTED_DETECTORS = tuple(det.__name__ for det, _ in PE_ENCODERS)


class PEEncoderMixin:
    """Puts a relative position encoding (iRPE, RoPE-2D, RoPE-Mixed or an
    offset bias: log-CPB, 2D ALiBi, LookHere) into
    every encoder self-attention of an mmdet DETR-family detector, and lets
    the absolute part be sine, learnable or none:
    ``class PEConditionalDETR(PEEncoderMixin, ConditionalDETR)``.

    The one setting is ``encoder_pe=dict(absolute=..., relative=...,
    decoder_pos=...)`` (choices in :mod:`.encoder_pe`), e.g.
    ``encoder_pe=dict(absolute='sine', relative=dict(type='rope-mixed'))``.
    It fills the keys below, which older configs set directly.

    What changes against the plain detector:

    - ``encoder.layer_cfg.self_attn_cfg`` accepts ``rpe_cfg`` (arguments of
      :class:`~mmpe.models.layers.iRPE`), ``rpe_on`` and ``attn_impl``; the
      encoder's mmcv attentions become
      :class:`~mmpe.models.layers.PEMultiheadAttention` (same parameter
      names: the plain detector's state dict loads with only the
      ``rpe_*.table`` entries missing; zero tables give the plain
      detector's outputs), and ``rope_cfg`` (2D RoPE of q and k, its
      RoPE-Mixed frequencies ``self_attn.rope.freqs`` the only new entries);
    - ``encoder_pe.absolute='learnable'`` adds
      ``learned_positional_encoding`` (mmdet's row/column embedding);
    - ``positional_encoding=None`` removes the sine absolute encoding from
      encoder and decoder keys (the paper's "no abs PE" rows); it is
      replaced by zeros so that mmdet's layers need no change;
    - the RPE tables are initialised as ``rpe_cfg['init']`` says and the
      RoPE-Mixed frequencies as Heo et al., after the detector's own
      initialisation (which Xavier-initialises every encoder matrix);
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
                 encoder_pe: Optional[Dict] = None,
                 **kwargs) -> None:
        (self.abs_pe, relative, self.decoder_pos,
         self.learnable_grid) = parse_encoder_pe(
             encoder_pe, sine_removed=positional_encoding is None)
        self.use_abs_pe = self.abs_pe != 'none'
        # built in _init_layers (nn.Module is not set up yet)
        self._rope_coords_cfg = rope_coords_cfg(relative)
        self.encoder = kwargs['encoder']
        self._irpe_encoder_class(relative)  # refuses other encoders early
        attn_cfg = kwargs['encoder']['layer_cfg']['self_attn_cfg']
        if positional_encoding is None:
            # Built (it holds no parameters) but its output is replaced by 0.
            positional_encoding = dict(
                num_feats=attn_cfg['embed_dims'] // 2, normalize=True)
        if encoder_pe is not None and 'relative' in encoder_pe:
            given = [k for k in ('rpe_cfg', 'rope_cfg', 'bias_cfg')
                     if attn_cfg.get(k)]
            if given:
                raise ValueError(
                    f'`encoder_pe.relative` and `encoder.layer_cfg.'
                    f'self_attn_cfg.{given[0]}` both given; please set the '
                    'relative part in one place (`encoder_pe`)')
            attn_cfg = dict(
                attn_cfg,
                **attention_pe_cfg(relative, attn_cfg['embed_dims'],
                                   attn_cfg['num_heads']))
            encoder = kwargs['encoder']
            kwargs['encoder'] = dict(
                encoder,
                layer_cfg=dict(encoder['layer_cfg'], self_attn_cfg=attn_cfg))
        super().__init__(
            *args, positional_encoding=positional_encoding, **kwargs)

    def _irpe_encoder_class(self, relative=None) -> type:
        for detector, encoder in PE_ENCODERS:
            if isinstance(self, detector):
                return encoder
        attn_cfg = self.encoder['layer_cfg']['self_attn_cfg']
        relative = relative or attn_cfg.get('rpe_cfg') or attn_cfg.get(
            'rope_cfg')
        raise ValueError(
            f'Unsupported detector {type(self).__name__} for a relative '
            f'encoder position encoding (`encoder_pe.relative` / '
            f'`encoder.layer_cfg.self_attn_cfg.rpe_cfg` {relative!r}): it '
            f'needs plain multi-head self-attention in the encoder (this '
            f'detector\'s encoder attention is not); please choose a '
            f'detector from {SUPPORTED_DETECTORS}')

    def _init_layers(self) -> None:
        # the iRPE encoder, then the plain detector's layers from a config
        # without mmpe's arguments, its plain encoder replaced
        encoder_cfg = self.encoder
        encoder = self._irpe_encoder_class()(**encoder_cfg)
        self.encoder = encoder_without_pe_args(encoder_cfg)
        super()._init_layers()
        # mmdet's forward of the encoder it built is the one that runs
        assert isinstance(encoder, type(self.encoder))
        self.encoder = encoder
        # the RoPE token positions of a batch, made once for all layers
        # (None: integer indices, the rotary modules' own cached tables)
        self.rope_coords = None
        if self._rope_coords_cfg is not None:
            self.rope_coords = RoPECoords(
                **self._rope_coords_cfg, prefix='encoder_pe.relative.')
        num_feats = self.positional_encoding.num_feats
        if num_feats * 2 != self.embed_dims:
            raise ValueError(
                f'`positional_encoding.num_feats` ({num_feats}) must be half '
                f'of the encoder\'s embed_dims ({self.embed_dims})')
        if self.abs_pe == 'learnable':
            self.learned_positional_encoding = LearnedPositionalEncoding(
                num_feats,
                row_num_embed=self.learnable_grid,
                col_num_embed=self.learnable_grid)

    def init_weights(self) -> None:
        """The detector's init (Xavier on every encoder matrix), then each
        RPE table as its own ``init`` says, the RoPE-Mixed frequencies as
        Heo et al. draw them and the log-CPB MLPs as Swin-V2 initialises
        them."""
        super().init_weights()
        for module in self.encoder.modules():
            if isinstance(module, iRPE):
                module.reset_table()
            elif isinstance(module, (RoPEMixed, LogCPB)):
                module.reset_parameters()

    def _learned_pos(self, feat: Tensor) -> Tensor:
        """(bs, h * w, dim) learned row/column encoding of the grid."""
        bs, _, height, width = feat.shape
        if max(height, width) > self.learnable_grid:
            raise ValueError(
                f'Feature grid {(height, width)} is larger than '
                f'`encoder_pe.learnable_grid` ({self.learnable_grid}); '
                'please build the model with a larger grid')
        grid = feat.new_zeros((bs, height, width), dtype=torch.bool)
        pos = self.learned_positional_encoding(grid)  # (bs, dim, h, w)
        return pos.flatten(2).transpose(1, 2)

    def pre_transformer(
            self,
            img_feats: Tuple[Tensor],
            batch_data_samples: OptSampleList = None) -> Tuple[Dict, Dict]:
        """The detector's inputs plus the encoder's token grid.

        Returns:
            tuple[dict, dict]: encoder inputs (``feat``, ``feat_mask``,
            ``feat_pos``, ``spatial_shape``, ``rope_pos``) and decoder
            inputs (``memory_mask``, ``memory_pos``).
        """
        encoder_inputs_dict, decoder_inputs_dict = super().pre_transformer(
            img_feats, batch_data_samples)
        return self.encoder_pe_inputs(img_feats, encoder_inputs_dict,
                                      decoder_inputs_dict)

    def encoder_pe_inputs(self, img_feats: Tuple[Tensor],
                          encoder_inputs_dict: Dict,
                          decoder_inputs_dict: Dict) -> Tuple[Dict, Dict]:
        """mmpe's part of :meth:`pre_transformer`, on top of what mmdet's
        ``pre_transformer`` returns (also called by
        :class:`mmpe.deployment.DETRExportWrapper`, which builds mmdet's part
        with tensor ops for export).

        Adds the grid ``spatial_shape=(h, w)`` of the last feature map and
        the RoPE positions ``rope_pos`` (:class:`RoPECoords` of the grid and
        ``feat_mask``: normalised coordinates use each image's valid extent;
        None for integer indices), replaces ``feat_pos`` by the chosen
        absolute encoding (mmdet's sine, learnable, or zeros for
        ``'none'``) and sets ``memory_pos`` as ``decoder_pos`` says.

        Args:
            img_feats (tuple[Tensor]): Neck outputs; the last is
                ``(bs, dim, h, w)``.
            encoder_inputs_dict (dict): mmdet's encoder inputs (``feat``,
                ``feat_mask``, ``feat_pos`` the (bs, h * w, dim) sine).
            decoder_inputs_dict (dict): mmdet's decoder inputs
                (``memory_mask``, ``memory_pos``).

        Returns:
            tuple[dict, dict]: The two dicts, updated in place.
        """
        # the sizes as the tensor gives them: ints in eager mode, symbolic
        # while a graph is traced with dynamic shapes (int() would freeze it)
        height, width = img_feats[-1].shape[-2:]
        encoder_inputs_dict['spatial_shape'] = (height, width)
        sine = encoder_inputs_dict['feat_pos']
        rope_pos = None
        if self.rope_coords is not None:
            dtype = torch.float64 if sine.dtype == torch.float64 else \
                torch.float32
            rope_pos = self.rope_coords((height, width),
                                        encoder_inputs_dict.get('feat_mask'),
                                        sine.device, dtype)
        encoder_inputs_dict['rope_pos'] = rope_pos
        if self.abs_pe == 'none':
            encoder_inputs_dict['feat_pos'] = torch.zeros_like(sine)
        elif self.abs_pe == 'learnable':
            encoder_inputs_dict['feat_pos'] = self._learned_pos(img_feats[-1])
        memory_pos = dict(
            sine=sine,
            encoder=encoder_inputs_dict['feat_pos'],
            none=torch.zeros_like(sine))[self.decoder_pos]
        decoder_inputs_dict['memory_pos'] = memory_pos
        return encoder_inputs_dict, decoder_inputs_dict

    def forward_encoder(self,
                        feat: Tensor,
                        feat_mask: Tensor,
                        feat_pos: Tensor,
                        spatial_shape: Tuple[int, int],
                        rope_pos: Optional[Tensor] = None) -> Dict:
        """Encoder forward; every self-attention gets ``spatial_shape`` and
        ``rope_pos``.

        Args:
            feat (Tensor): (bs, h * w, dim) flattened features.
            feat_mask (Tensor): (bs, h * w) padding mask, or None.
            feat_pos (Tensor): (bs, h * w, dim) absolute encoding.
            spatial_shape (tuple[int, int]): Feature grid (h, w).
            rope_pos (Tensor, optional): (bs, h * w, 2) or (h * w, 2) RoPE
                token positions ``(y, x)``; None: integer indices.

        Returns:
            dict: ``memory`` of shape (bs, h * w, dim).
        """
        memory = self.encoder(
            query=feat,
            query_pos=feat_pos,
            key_padding_mask=feat_mask,
            spatial_shape=spatial_shape,
            rope_pos=rope_pos)
        return dict(memory=memory)
