"""The released RT-DETRv2 decoder's keys in mmpe's names (the parity
tests load every key their fixtures list strictly through this mapping)."""
import pytest
import torch

from mmpe.models.utils import convert_rtdetr_decoder, rtdetr_decoder_key


def test_keys_map_by_prefix_and_derived_buffers_drop():
    key = 'decoder.decoder.layers.0.cross_attn.sampling_offsets.weight'
    assert rtdetr_decoder_key(key) == (
        'bbox_head.decoder.layers.0.cross_attn.sampling_offsets.weight')
    assert rtdetr_decoder_key(
        'decoder.decoder.layers.0.cross_attn.num_points_scale') is None
    assert rtdetr_decoder_key('decoder.anchors') is None
    assert rtdetr_decoder_key('decoder.valid_mask') is None
    with pytest.raises(ValueError, match='decoder.'):
        rtdetr_decoder_key('encoder.input_proj.0.conv.weight')
    out = convert_rtdetr_decoder({
        'backbone.conv1.weight': torch.zeros(1),
        'decoder.enc_output.proj.weight': torch.ones(2),
    })
    assert list(out) == ['bbox_head.enc_output.proj.weight']

