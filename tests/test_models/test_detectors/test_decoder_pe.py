"""``decoder_pe``: BoxRPB in the decoders of DAB-DETR and Conditional DETR.

Expected values come from mmdet's own detectors (DABDETR, ConditionalDETR)
built with the same weights, and from each image run alone.
"""
import copy
import os.path as osp
import re

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmengine.config import Config

import mmpe  # noqa: F401
from config_steps import detection_train_step
from mmpe.models.detectors import BoxRPBConditionalDecoder, BoxRPBDABDecoder
from mmpe.models.layers import BiasedConditionalAttention, BoxRPB

from feature_samples import feature_samples

ROOT = osp.join(osp.dirname(__file__), '..', '..', '..')
QUICK = osp.join(ROOT, 'configs', 'quickstart')
# config with the bias -> (mmdet detector, biased decoder class)
CONFIGS = {
    'dab-detr_box-rpb_r18_synthetic.py': ('DABDETR', BoxRPBDABDecoder),
    'conditional-detr_point-rpb_r18_synthetic.py':
    ('ConditionalDETR', BoxRPBConditionalDecoder),
}
# float32 through 3 decoder layers: the core's attention (SDPA) sums in
# another order than mmdet's bmm / softmax
ATOL, RTOL = 1e-5, 1e-4
# the same queries with more (masked) keys in the softmax sums
INVARIANCE_ATOL = 1e-5


def _cfg(name, **decoder_pe):
    cfg = copy.deepcopy(Config.fromfile(osp.join(QUICK, name)).model)
    cfg.decoder_pe.update(decoder_pe)
    return cfg


def _plain_cfg(name):
    """mmdet's detector of the same config: its type, no mmpe keys."""
    cfg = _cfg(name)
    cfg.type = CONFIGS[name][0]
    cfg.pop('encoder_pe', None)
    cfg.pop('decoder_pe', None)
    return cfg


def _build(cfg, seed):
    torch.manual_seed(seed)
    model = MODELS.build(cfg)
    model.init_weights()
    return model.eval()


def _load_plain(model, plain):
    result = model.load_state_dict(plain.state_dict(), strict=False)
    assert not result.unexpected_keys
    assert all(
        re.fullmatch(r'decoder\.box_rpb\.\d\.mlp_[xy]\.\d\.(weight|bias)', k)
        for k in result.missing_keys), result.missing_keys
    return result.missing_keys


def _decoder_inputs(model, feat, img_shapes, stride=8):
    """Encoder and decoder inputs from fixed neck features (bs, dim, h, w)
    of images whose feature sizes are ``img_shapes``."""
    _, _, h, w = feat.shape
    samples = feature_samples(feat, img_shapes, stride)
    enc, dec = model.pre_transformer((feat, ), samples)
    return enc, dec


def _decode(model, enc, dec):
    """pre_decoder, forward_decoder and the head: (scores, boxes) of every
    layer."""
    memory = model.forward_encoder(**enc)['memory']
    tmp, head_in = model.pre_decoder(memory)
    dec = dict(dec, **tmp)
    head_in.update(model.forward_decoder(**dec))
    return model.bbox_head.forward(**head_in)


def _feat(model, shapes, seed=1):
    torch.manual_seed(seed)
    h = max(s[0] for s in shapes)
    w = max(s[1] for s in shapes)
    # what lies in the padding must not matter: random, not zeros
    return torch.randn(len(shapes), model.embed_dims, h, w)


@pytest.mark.parametrize('name', CONFIGS)
def test_none_is_mmdets_decoder_bit_for_bit(name):
    """decoder_pe=None: mmdet's decoder class, and with the same memory and
    weights the decoder and head give mmdet's outputs exactly."""
    plain = _build(_plain_cfg(name), 0)
    cfg = _cfg(name)
    cfg.decoder_pe = None
    model = _build(cfg, 1)
    assert type(model.decoder) is type(plain.decoder)
    assert not any(isinstance(m, (BoxRPB, BiasedConditionalAttention))
                   for m in model.modules())
    result = model.load_state_dict(plain.state_dict(), strict=False)
    assert not result.unexpected_keys and not [
        k for k in result.missing_keys if not k.startswith('encoder.')
    ]
    shapes = [(6, 9), (10, 5)]
    feat = _feat(model, shapes)
    with torch.no_grad():
        enc, dec = _decoder_inputs(plain, feat, shapes)
        memory = plain.forward_encoder(**enc)['memory']
        outs = []
        for m in (plain, model):
            tmp, head_in = m.pre_decoder(memory)
            head_in.update(m.forward_decoder(**dict(dec, **tmp)))
            outs.append(m.bbox_head.forward(**head_in))
    for want, got in zip(*outs):
        assert torch.equal(want, got)


@pytest.mark.parametrize('name', CONFIGS)
def test_plain_checkpoint_loads_and_zero_bias_equals_mmdet(name):
    """A plain checkpoint loads with only the MLPs missing; with zero output
    weights (zero bias) the detector equals mmdet's up to float order."""
    plain = _build(_plain_cfg(name), 0)
    model = _build(_cfg(name), 1)
    detector, decoder = CONFIGS[name]
    assert type(model.decoder) is decoder
    assert isinstance(model, MODELS.get(detector))
    missing = _load_plain(model, plain)
    assert len(missing) == 3 * 2 * 3  # 3 layers x 2 axes x (w1, b1, w2)
    for rpb in model.decoder.box_rpb:
        for mlp in (rpb.mlp_x, rpb.mlp_y):
            mlp[2].weight.data.zero_()
    shapes = [(6, 9), (10, 5)]
    feat = _feat(model, shapes)
    with torch.no_grad():
        want = _decode(plain, *_decoder_inputs(plain, feat, shapes))
        got = _decode(model, *_decoder_inputs(model, feat, shapes))
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize('name', CONFIGS)
def test_bias_changes_outputs_and_trains(name):
    plain = _build(_plain_cfg(name), 0)
    model = _build(_cfg(name), 1)
    _load_plain(model, plain)
    # trained-size MLPs (Plain-DETR's init, std 0.02, moves the outputs
    # ~1e-3 only)
    for p in model.decoder.box_rpb.parameters():
        p.data.normal_(std=0.3)
    shapes = [(6, 9), (10, 5)]
    feat = _feat(model, shapes)
    with torch.no_grad():
        want = _decode(plain, *_decoder_inputs(plain, feat, shapes))
        got = _decode(model, *_decoder_inputs(model, feat, shapes))
    assert max((g - w).abs().max() for g, w in zip(got, want)) > 1000 * ATOL

    model.train()
    detection_train_step(model, model.bbox_head.num_classes)
    for name_, p in model.decoder.box_rpb.named_parameters():
        assert p.grad is not None and torch.count_nonzero(p.grad) > 0, name_


@pytest.mark.parametrize('shared', [False, True])
@pytest.mark.parametrize('name', CONFIGS)
def test_decoder_output_does_not_depend_on_the_other_image(name, shared):
    """Padded batch vs each image alone: the bias reads each image's valid
    extent, so scores and boxes are equal."""
    model = _build(_cfg(name, shared=shared), 0)
    assert len(model.decoder.box_rpb) == (1 if shared else 3)
    for p in model.decoder.box_rpb.parameters():  # trained-size bias
        p.data.normal_(std=0.3)
    shapes = [(6, 9), (10, 5)]
    feat = _feat(model, shapes)
    with torch.no_grad():
        batched = _decode(model, *_decoder_inputs(model, feat, shapes))
        for i, (h, w) in enumerate(shapes):
            alone_feat = feat[i:i + 1, :, :h, :w].contiguous()
            alone = _decode(model,
                            *_decoder_inputs(model, alone_feat, [(h, w)]))
            for b, a in zip(batched, alone):
                torch.testing.assert_close(
                    b[:, i:i + 1], a, atol=INVARIANCE_ATOL, rtol=0)


@pytest.mark.parametrize('impl', ['explicit', 'chunked'])
def test_backends_agree_in_training(impl):
    """The decoder's backends give the same loss and MLP gradients."""
    name = 'dab-detr_box-rpb_r18_synthetic.py'
    grads = {}
    for backend in ('explicit', impl):
        model = _build(_cfg(name, attn_impl=backend, chunk_size=3), 0)
        for p in model.decoder.box_rpb.parameters():
            p.data.normal_(std=0.3, generator=torch.Generator().manual_seed(
                p.numel()))
        torch.manual_seed(5)
        detection_train_step(model, model.bbox_head.num_classes)
        grads[backend] = {
            n: p.grad.clone()
            for n, p in model.named_parameters() if p.grad is not None
        }
    for key, want in grads['explicit'].items():
        torch.testing.assert_close(grads[impl][key], want, atol=1e-5,
                                   rtol=1e-4, msg=key)


def test_bad_settings_name_the_choices():
    dab = 'dab-detr_box-rpb_r18_synthetic.py'
    cond = 'conditional-detr_point-rpb_r18_synthetic.py'
    with pytest.raises(ValueError, match=r"'box-rpb'.*\('point-rpb',\)"):
        MODELS.build(_cfg(cond, type='box-rpb'))
    with pytest.raises(ValueError, match=r"`decoder_pe.type` 'boxrpb'.*"
                       r"\('box-rpb', 'point-rpb'\)"):
        MODELS.build(_cfg(dab, type='boxrpb'))
    with pytest.raises(ValueError,
                       match=r"`decoder_pe.offsets` 'log'.*'linear', 'log8'"):
        MODELS.build(_cfg(dab, offsets='log'))
    with pytest.raises(ValueError, match=r"keys \['heads'\].*'hidden'"):
        MODELS.build(_cfg(dab, heads=4))
    with pytest.raises(ValueError, match=r"`decoder_pe.attn_impl` 'flex'"):
        MODELS.build(_cfg(dab, attn_impl='flex'))
    # the point variant on DAB-DETR reads the anchors' centres
    model = _build(_cfg(dab, type='point-rpb'), 0)
    assert all(r.mode == 'point' for r in model.decoder.box_rpb)
