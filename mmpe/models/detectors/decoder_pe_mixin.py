"""``decoder_pe``: the box-to-pixel relative position bias (BoxRPB, Lin et
al., ICCV 2023) in the decoder of DAB-DETR and Conditional DETR.

With ``decoder_pe=None`` nothing changes: the detector is mmdet's (with
mmpe's encoder). With a setting (:mod:`.decoder_pe`) the decoder becomes
:class:`~.box_rpb_decoders.BoxRPBDABDecoder` /
:class:`~.box_rpb_decoders.BoxRPBConditionalDecoder` (mmdet's parameters
plus ``decoder.box_rpb.*``: a plain checkpoint loads with only those
missing), and the memory grid ``spatial_shape=(h, w)`` goes into the
decoder inputs.
"""
from typing import Dict, Optional, Tuple

from mmdet.models.detectors import DABDETR, ConditionalDETR
from torch import Tensor

from .box_rpb_decoders import BoxRPBConditionalDecoder, BoxRPBDABDecoder
from .decoder_pe import DECODER_PE_TYPES, parse_decoder_pe


class DecoderPEMixin:
    """Adds ``decoder_pe`` to a DAB-DETR or Conditional DETR detector
    (before :class:`~.encoder_pe_mixin.PEEncoderMixin` in the bases).

    Args:
        decoder_pe (None | str | dict): See :mod:`.decoder_pe`.
            Defaults to None.
    """

    def __init__(self, *args, decoder_pe=None, **kwargs) -> None:
        if isinstance(self, DABDETR):
            query_dim = kwargs.get('decoder', {}).get('query_dim', 4)
            allowed = DECODER_PE_TYPES if query_dim == 4 else ('point-rpb', )
            self._rpb_decoder = BoxRPBDABDecoder
        elif isinstance(self, ConditionalDETR):
            allowed, self._rpb_decoder = ('point-rpb', ), \
                BoxRPBConditionalDecoder
        else:
            raise ValueError(
                f'Unsupported detector {type(self).__name__} for '
                '`decoder_pe`; please choose DABDETR or ConditionalDETR')
        self.decoder_pe = parse_decoder_pe(decoder_pe, allowed)
        super().__init__(*args, **kwargs)

    def _init_layers(self) -> None:
        decoder_cfg = self.decoder
        super()._init_layers()
        if self.decoder_pe is not None:
            decoder = self._rpb_decoder(
                **decoder_cfg, decoder_pe=self.decoder_pe)
            # mmdet's forward of the decoder it built is the one extended
            assert isinstance(decoder, type(self.decoder))
            self.decoder = decoder

    def init_weights(self) -> None:
        """The detector's init, then Plain-DETR's init of the MLPs."""
        super().init_weights()
        if self.decoder_pe is not None:
            self.decoder.reset_box_rpb()

    def encoder_pe_inputs(self, img_feats: Tuple[Tensor],
                          encoder_inputs_dict: Dict,
                          decoder_inputs_dict: Dict) -> Tuple[Dict, Dict]:
        """The encoder's part, and with ``decoder_pe`` the memory grid
        ``spatial_shape=(h, w)`` in the decoder inputs."""
        encoder_inputs_dict, decoder_inputs_dict = super().encoder_pe_inputs(
            img_feats, encoder_inputs_dict, decoder_inputs_dict)
        if self.decoder_pe is not None:
            decoder_inputs_dict['spatial_shape'] = tuple(
                img_feats[-1].shape[-2:])
        return encoder_inputs_dict, decoder_inputs_dict

    def forward_decoder(self,
                        query: Tensor,
                        query_pos: Tensor,
                        memory: Tensor,
                        memory_mask: Tensor,
                        memory_pos: Tensor,
                        spatial_shape: Optional[Tuple[int, int]] = None
                        ) -> Dict:
        """mmdet's ``forward_decoder``; with ``decoder_pe`` the decoder also
        gets the memory grid."""
        if self.decoder_pe is None:
            return super().forward_decoder(query, query_pos, memory,
                                           memory_mask, memory_pos)
        extra = dict(reg_branches=self.bbox_head.fc_reg) if isinstance(
            self, DABDETR) else {}
        hidden_states, references = self.decoder(
            query=query,
            key=memory,
            query_pos=query_pos,
            key_pos=memory_pos,
            key_padding_mask=memory_mask,
            spatial_shape=spatial_shape,
            **extra)
        return dict(hidden_states=hidden_states, references=references)
