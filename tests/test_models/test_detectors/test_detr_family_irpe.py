"""iRPE in the encoders of Conditional DETR and DAB-DETR (PEEncoderMixin).

Expected values come from mmdet's plain detectors (ConditionalDETR, DABDETR)
with the same weights, and from the same encoder run on each image alone.
"""
import copy
import os.path as osp
import re

import mmdet
import pytest
import torch
from mmdet.models.detectors import DeformableDETR
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config

import mmpe  # noqa: F401
from mmpe.models.detectors import PEEncoderMixin
from mmpe.models.layers.irpe.irpe import iRPE

from feature_samples import feature_samples

ROOT = osp.join(osp.dirname(__file__), '..', '..', '..')
QUICK = osp.join(ROOT, 'configs', 'quickstart')
# iRPE config -> the mmdet detector it extends
DETECTORS = {
    'conditional-detr_irpe_r18_synthetic.py': 'ConditionalDETR',
    'dab-detr_irpe_r18_synthetic.py': 'DABDETR',
}
ALL_IRPE = ['detr_irpe_r18_synthetic.py', *DETECTORS]
# float32 through 3 encoder + 3 decoder layers; iRPE with zero tables adds
# exact zeros, the op order differs from mmcv's fused attention
ATOL, RTOL = 1e-5, 1e-4
# the same tokens with more (masked) keys in the softmax sums
INVARIANCE_ATOL = 1e-5


def _irpe_cfg(name, table_init=None, **attn):
    """The quick-start config's model; iRPE arguments changed in whichever
    spelling the config uses (``encoder_pe.relative`` or the encoder's
    ``self_attn_cfg.rpe_cfg`` / ``rpe_on``)."""
    cfg = copy.deepcopy(Config.fromfile(osp.join(QUICK, name)).model)
    self_attn = cfg.encoder.layer_cfg.self_attn_cfg
    if 'encoder_pe' in cfg:
        rpe, on_key = cfg.encoder_pe.relative, 'on'
    else:
        rpe, on_key = self_attn.rpe_cfg, 'rpe_on'
    if table_init is not None:
        rpe.init = table_init
    if 'mode' in attn:
        rpe.mode = attn.pop('mode')
    if 'rpe_on' in attn:
        (rpe if on_key == 'on' else self_attn)[on_key] = attn.pop('rpe_on')
    self_attn.update(attn)
    return cfg


def _plain_cfg(name):
    """The mmdet detector of the same config: its type, no mmpe keys."""
    cfg = _irpe_cfg(name)
    cfg.type = DETECTORS[name]
    cfg.pop('encoder_pe', None)
    attn = cfg.encoder.layer_cfg.self_attn_cfg
    for key in ('rpe_cfg', 'rpe_on', 'attn_impl'):
        attn.pop(key, None)
    return cfg


def _build(cfg, seed):
    torch.manual_seed(seed)
    model = MODELS.build(cfg)
    model.init_weights()
    return model


def _batch(model, shapes, training, num_items=None):
    packed = demo_mm_inputs(
        batch_size=len(shapes),
        image_shapes=shapes,
        num_items=num_items,
        num_classes=4)
    return model.data_preprocessor(packed, training)


def _load_plain(irpe, plain):
    """Load the plain detector's weights; only the tables may be missing."""
    result = irpe.load_state_dict(plain.state_dict(), strict=False)
    assert not result.unexpected_keys
    assert all(
        re.fullmatch(r'encoder\.layers\.\d\.self_attn\.rpe_[qkv]\.table', k)
        for k in result.missing_keys), result.missing_keys
    return result.missing_keys


# the configs' setting, and other in-attention settings and backends
VARIANTS = {
    'ctx-k': dict(),
    'ctx-qkv': dict(rpe_on='qkv'),
    'bias-k-sdpa': dict(mode='bias', attn_impl='sdpa'),
}


@pytest.mark.parametrize('variant', VARIANTS)
@pytest.mark.parametrize('name', DETECTORS)
def test_plain_state_dict_loads_and_zero_tables_equal_plain(name, variant):
    attn = VARIANTS[variant]
    plain = _build(_plain_cfg(name), 0).eval()
    irpe = _build(_irpe_cfg(name, 'zeros', **attn), 1).eval()
    assert type(plain).__name__ == DETECTORS[name]
    assert isinstance(irpe, type(plain))
    missing = _load_plain(irpe, plain)
    per_layer = len(attn.get('rpe_on', 'k'))  # one table per q / k / v
    assert len(missing) == 3 * per_layer  # 3 encoder layers
    rpes = [m for m in irpe.modules() if isinstance(m, iRPE)]
    assert len(rpes) == 3 * per_layer
    assert all(m.mode == attn.get('mode', 'contextual') for m in rpes)
    assert all(layer.self_attn.attn_impl == attn.get('attn_impl', 'auto')
               for layer in irpe.encoder.layers)
    assert all(torch.count_nonzero(m.table) == 0 for m in rpes)

    data = _batch(plain, [(3, 96, 160), (3, 128, 80)], False)
    with torch.no_grad():
        want = plain(**data, mode='tensor')
        got = irpe(**data, mode='tensor')
    assert len(want) == len(got)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize('name', DETECTORS)
def test_nonzero_tables_change_outputs_and_get_gradients(name):
    plain = _build(_plain_cfg(name), 0).eval()
    irpe = _build(_irpe_cfg(name, 'xavier'), 1).eval()
    _load_plain(irpe, plain)
    rpes = [m for m in irpe.modules() if isinstance(m, iRPE)]
    # trained-table scale: Xavier's tables at init move the outputs ~1e-3
    torch.manual_seed(2)
    for m in rpes:
        m.table.data.normal_(std=0.5)

    data = _batch(plain, [(3, 96, 160), (3, 128, 80)], False)
    with torch.no_grad():
        memories = []
        for model in (plain, irpe):
            feats = model.extract_feat(data['inputs'])
            enc, _ = model.pre_transformer(feats, data['data_samples'])
            memories.append(model.forward_encoder(**enc)['memory'])
        want = plain(**data, mode='tensor')
        got = irpe(**data, mode='tensor')
    # encoder and predictions change far beyond the zero-table tolerance
    # (small at init: random weights give small queries and logits)
    assert (memories[1] - memories[0]).abs().max() > 1000 * ATOL
    assert max((g - w).abs().max() for g, w in zip(got, want)) > 10 * ATOL

    irpe.train()
    data = _batch(irpe, [(3, 96, 160), (3, 128, 80)], True, num_items=[3, 1])
    losses = irpe(**data, mode='loss')
    total = sum(v for k, v in losses.items() if 'loss' in k)
    assert torch.isfinite(total)
    total.backward()
    for m in rpes:
        assert m.table.grad is not None
        assert torch.count_nonzero(m.table.grad) > 0


def _encode(model, feat, img_shapes, stride=8):
    """The encoder path from fixed neck features: mmdet's pre_transformer
    (padding mask and sine encoding from the image sizes) and the encoder.

    Args:
        feat (Tensor): (bs, dim, h, w) features of the padded batch.
        img_shapes (list[tuple[int, int]]): Each image's feature size.

    Returns:
        Tensor: (bs, h, w, dim) encoder output.
    """
    bs, dim, h, w = feat.shape
    samples = feature_samples(feat, img_shapes, stride)
    enc_inputs, _ = model.pre_transformer((feat, ), samples)
    assert enc_inputs['spatial_shape'] == (h, w)
    memory = model.forward_encoder(**enc_inputs)['memory']
    return memory.view(bs, h, w, dim)  # (bs, h * w, dim) -> (bs, h, w, dim)


@pytest.mark.parametrize('name', ALL_IRPE)
def test_encoder_output_does_not_depend_on_the_other_image(name):
    """Padded batch vs each image alone: equal on the valid tokens. mmdet
    pads bottom/right, so a token's (row, col) on the padded grid is its
    (row, col) in the image alone, and relative positions are unchanged."""
    model = _build(_irpe_cfg(name, 'xavier'), 0).eval()
    rpes = [m for m in model.modules() if isinstance(m, iRPE)]
    assert rpes and all(torch.count_nonzero(m.table) > 0 for m in rpes)
    dim = model.embed_dims
    # A is wider, B taller: A padded at the bottom, B on the right
    shapes = [(6, 9), (10, 5)]
    height = max(s[0] for s in shapes)
    width = max(s[1] for s in shapes)
    torch.manual_seed(1)
    # what lies in the padding must not matter: random, not zeros
    feat = torch.randn(2, dim, height, width)
    with torch.no_grad():
        batched = _encode(model, feat, shapes)
        for i, (h, w) in enumerate(shapes):
            alone = _encode(model, feat[i:i + 1, :, :h, :w].contiguous(),
                            [(h, w)])
            torch.testing.assert_close(
                batched[i, :h, :w], alone[0], atol=INVARIANCE_ATOL, rtol=0)


@pytest.mark.parametrize('name', DETECTORS)
def test_no_absolute_pe_variant(name):
    cfg = _irpe_cfg(name)
    cfg.encoder_pe.absolute = 'none'
    cfg.encoder_pe.decoder_pos = 'encoder'
    model = _build(cfg, 0).train()
    assert not model.use_abs_pe
    data = _batch(model, [(3, 96, 96), (3, 64, 128)], True)
    feats = model.extract_feat(data['inputs'])
    enc, dec = model.pre_transformer(feats, data['data_samples'])
    assert torch.count_nonzero(enc['feat_pos']) == 0
    assert torch.count_nonzero(dec['memory_pos']) == 0
    assert enc['spatial_shape'] == (12, 16)  # 96 x 128 at stride 8
    losses = model(**data, mode='loss')
    assert all(torch.isfinite(v).all() for v in losses.values())


def test_encoder_without_plain_self_attention_is_refused():
    """Deformable DETR's encoder is multi-scale deformable attention: no
    place for relative terms on one grid."""

    class iRPEDeformableDETR(PEEncoderMixin, DeformableDETR):
        pass

    cfg = Config.fromfile(
        osp.join(
            osp.dirname(mmdet.__file__), '.mim', 'configs', 'deformable_detr',
            'deformable-detr_r50_16xb2-50e_coco.py')).model
    cfg = copy.deepcopy(cfg).to_dict()
    cfg.pop('type')
    cfg['backbone']['init_cfg'] = None
    cfg['encoder']['layer_cfg']['self_attn_cfg']['rpe_cfg'] = dict(
        mode='contextual')
    with pytest.raises(ValueError,
                       match=r"(?s)rpe_cfg.*'contextual'.*'DABDETR'"):
        iRPEDeformableDETR(**cfg)
    cfg['encoder']['layer_cfg']['self_attn_cfg'].pop('rpe_cfg')
    cfg['encoder_pe'] = dict(relative='rope-mixed')
    with pytest.raises(
            ValueError,
            match=r"(?s)iRPEDeformableDETR.*encoder_pe.*'rope-mixed'.*DABDETR"):
        iRPEDeformableDETR(**cfg)
