"""PaddingAwareEncoderDecoder: each image of a padded batch gets its own
backbone features and logits.

Reference: the same model on the image alone (unpadded). The backbone's
valid tokens must match exactly (to float tolerance); the logits too,
except within the decode path's reach of the padding (``BAND`` pixels from
an image's bottom/right border that borders padding: there mmseg's convs
see the batch's zero features where the image alone has zero padding of
the conv). The plain ``EncoderDecoder`` with the same weights differs
everywhere (attention lets the padding in)."""
import copy
import os.path as osp

import pytest
import torch
from mmengine.config import Config, ConfigDict
from mmengine.registry import DefaultScope
from mmengine.structures import PixelData

from mmpe.models.utils import padding_mask_from_shapes
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG = 'configs/quickstart/fpn_cpvt-tiny_synthetic-seg.py'
SMALL = dict(embed_dims=32, depth=2, num_heads=2, mlp_ratio=2.)
# the stride-32 branch: simple-pyramid pool + 3x3 conv, FPNHead's 3x3 conv
# at 32, 16 and 8 with bilinear upsampling between: < 4 cells of 32 px
BAND = 128
TOL = dict(atol=2e-5, rtol=1e-5)
#: (h, w): one padded at the bottom, one at the right; batch 320 x 320
SHAPES = [(256, 320), (320, 192)]
POS_ENCODINGS = ['peg', 'sine', 'rope-mixed', 'irpe', ['peg', 'irpe'],
                 'none']
#: RoPE on DINOv3's normalised coordinates: each image's positions from its
#: valid extent in the mask
NORMALIZED = dict(coords='normalized', normalize='separate')
#: (pos_encoding, window_size, rope_cfg): every encoding global, and ViTDet's
#: layout (6 x 6 windows in block 0, block 1 global; grids 16 x 20 and
#: 20 x 12 in a 20 x 20 batch, none of them whole windows)
CASES = [(pe, 0, None) for pe in POS_ENCODINGS] + [
    (pe, 6, None) for pe in ('peg', 'rope-mixed', 'irpe')] + [
        ('rope-mixed', 0, NORMALIZED), ('rope2d', 6, NORMALIZED)] + [
    # the offset biases (LookHere: 4 heads, a multiple of its 4 directions)
    ('log-cpb', 6, None), ('alibi-2d', 0, None), ('lookhere', 0, None)]
CASE_IDS = [
    f'{pe}-{ws}' + ('-normalized' if rope_cfg else '')
    for pe, ws, rope_cfg in CASES
]


def _model_cfg(pos_encoding='peg', type_='PaddingAwareEncoderDecoder',
               window_size=0, rope_cfg=None):
    cfg = Config.fromfile(osp.join(REPO, CONFIG))
    model = copy.deepcopy(cfg.model)
    model.type = type_
    model.backbone.arch = SMALL
    if pos_encoding == 'lookhere':
        model.backbone.arch = dict(SMALL, num_heads=4)
    model.backbone.pos_encoding = pos_encoding
    if rope_cfg:
        model.backbone.rope_cfg = rope_cfg
    if window_size:
        model.backbone.window_size = window_size
        model.backbone.global_blocks = (SMALL['depth'] - 1, )
    if 'irpe' in pos_encoding:
        model.backbone.rpe_cfg = dict(mode='contextual', method='product',
                                      rpe_on='k')
    model.neck.in_channels = SMALL['embed_dims']
    # batches of SHAPES padded to 320 x 320 (the config's crop: 128 x 128)
    model.data_preprocessor.size = (320, 320)
    return model


def _build(model_cfg, seed=0):
    torch.manual_seed(seed)
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(copy.deepcopy(model_cfg))
    # non-zero tables and frequencies, as after training
    with torch.no_grad():
        for name, p in model.backbone.named_parameters():
            if 'rpe' in name or 'pos_embed' in name or 'grid_bias' in name:
                p.normal_(0, 0.5)
    return model.eval()


def _data(shapes, seed=1):
    g = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for h, w in shapes:
        inputs.append(torch.randint(0, 256, (3, h, w), generator=g).float())
        sample = SegDataSample()
        sample.gt_sem_seg = PixelData(
            data=torch.randint(0, 5, (1, h, w), generator=g))
        sample.set_metainfo(dict(img_shape=(h, w), ori_shape=(h, w)))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _record_backbone(model):
    calls = []
    model.backbone.register_forward_hook(
        lambda m, args, kwargs, out: calls.append(
            (out[-1].detach(), kwargs.get('padding_mask'))),
        with_kwargs=True)
    return calls


def _logits(model, data, calls, pad=True):
    """Logits at stride 4 of ``data`` padded to 320 x 320 (``pad``) or of
    its one image alone, unpadded (sides multiples of 32)."""
    calls.clear()
    batch = model.data_preprocessor(copy.deepcopy(data), training=pad)
    with torch.no_grad():
        logits = model(**batch, mode='tensor')
    return batch, logits


@pytest.mark.parametrize('pos_encoding,window_size,rope_cfg', CASES,
                         ids=CASE_IDS)
def test_padded_batch_equals_each_image_alone(pos_encoding, window_size,
                                              rope_cfg):
    model = _build(_model_cfg(pos_encoding, window_size=window_size,
                              rope_cfg=rope_cfg))
    plain = _build(
        _model_cfg(pos_encoding, 'EncoderDecoder', window_size=window_size,
                   rope_cfg=rope_cfg))
    assert model.backbone.blocks[0].window_size == window_size
    plain.load_state_dict(model.state_dict(), strict=True)
    calls = _record_backbone(model)
    data = _data(SHAPES)
    batch, logits = _logits(model, data, calls)
    assert tuple(batch['inputs'].shape[-2:]) == (320, 320)
    (feats, mask), = calls
    assert torch.equal(mask, padding_mask_from_shapes(SHAPES, (320, 320)))
    _, leaky = _logits(plain, data, [])

    stride = 4  # FPNHead's logits
    for i, (h, w) in enumerate(SHAPES):
        alone_data = dict(inputs=[data['inputs'][i]],
                          data_samples=[data['data_samples'][i]])
        batch_alone, alone = _logits(model, alone_data, calls, pad=False)
        assert tuple(batch_alone['inputs'].shape[-2:]) == (h, w)
        alone_feats, alone_mask = calls[0]
        assert alone_mask is None  # nothing padded alone
        ht, wt = h // 16, w // 16
        torch.testing.assert_close(feats[i, :, :ht, :wt], alone_feats[0],
                                   **TOL)
        # logits: the whole image where the batch adds no padding beside it,
        # else outside the band along the padded border
        hl = (h if h == 320 else h - BAND) // stride
        wl = (w if w == 320 else w - BAND) // stride
        assert hl > 0 and wl > 0
        torch.testing.assert_close(logits[i, :, :hl, :wl],
                                   alone[0, :, :hl, :wl], **TOL)
        if pos_encoding != 'none' or i == 1:
            assert not torch.allclose(leaky[i, :, :hl, :wl],
                                      alone[0, :, :hl, :wl], atol=1e-3)


def test_loss_uses_the_mask_and_checkpoints_interchange():
    model = _build(_model_cfg())
    plain = _build(_model_cfg(type_='EncoderDecoder'), seed=1)
    assert list(model.state_dict()) == list(plain.state_dict())
    plain.load_state_dict(model.state_dict(), strict=True)
    # an unpadded batch: no mask, the plain segmentor's logits exactly
    one = _data([(96, 160)])
    outs = []
    for m in (model, plain):
        b = m.data_preprocessor(copy.deepcopy(one), training=False)
        with torch.no_grad():
            outs.append(m(**b, mode='tensor'))
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)
    # training: the loss goes through the mask
    calls = _record_backbone(model)
    model.train()
    batch = model.data_preprocessor(_data(SHAPES), training=True)
    losses = model(**batch, mode='loss')
    assert torch.isfinite(losses['decode.loss_ce'])
    assert torch.equal(calls[0][1],
                       padding_mask_from_shapes(SHAPES, (320, 320)))


def test_predict_whole_and_slide_give_windows_their_mask():
    model_cfg = _model_cfg()
    # test images padded to a multiple of 64: 80 x 136 -> 128 x 192
    model_cfg.data_preprocessor.test_cfg = dict(size_divisor=64)
    model = _build(model_cfg)
    calls = _record_backbone(model)
    data = _data([(80, 136)])
    batch = model.data_preprocessor(copy.deepcopy(data), training=False)
    assert tuple(batch['inputs'].shape[-2:]) == (128, 192)
    full = padding_mask_from_shapes([(80, 136)], (128, 192))
    with torch.no_grad():
        whole = model(**copy.deepcopy(batch), mode='predict')
    assert torch.equal(calls[0][1], full)
    assert whole[0].seg_logits.data.shape[-2:] == (80, 136)

    model.test_cfg = ConfigDict(mode='slide', crop_size=(64, 64),
                                stride=(48, 48))
    calls.clear()
    with torch.no_grad():
        slide = model(**copy.deepcopy(batch), mode='predict')
    assert slide[0].seg_logits.data.shape[-2:] == (80, 136)
    # windows: rows 0, 48, 64 x cols 0, 48, 96, 128
    starts = [(y, x) for y in (0, 48, 64) for x in (0, 48, 96, 128)]
    assert len(calls) == len(starts)
    for (y, x), (_, mask) in zip(starts, calls):
        want = full[:, y:y + 64, x:x + 64]
        if want.any():
            assert torch.equal(mask, want)
        else:
            assert mask is None


def test_unpadded_slide_equals_mmseg_slide_inference():
    """No padding anywhere: the own sliding window is mmseg's."""
    model = _build(_model_cfg())
    plain = _build(_model_cfg(type_='EncoderDecoder'))
    plain.load_state_dict(model.state_dict())
    outs = []
    for m in (model, plain):
        m.test_cfg = ConfigDict(mode='slide', crop_size=(64, 64),
                                stride=(40, 40))
        torch.manual_seed(0)
        inputs = torch.rand(1, 3, 96, 160)
        metas = [dict(img_shape=(96, 160), ori_shape=(96, 160))]
        with torch.no_grad():
            outs.append(m.slide_inference(inputs, metas))
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)


def test_backbone_without_masks_is_refused():
    cfg = _model_cfg()
    cfg.backbone = dict(type='ResNetV1c', depth=18, init_cfg=None)
    cfg.neck = dict(type='FPN', in_channels=[64, 128, 256, 512],
                    out_channels=64, num_outs=4)
    with pytest.raises(ValueError, match='ResNetV1c.*mask-aware backbones'):
        _build(cfg)
