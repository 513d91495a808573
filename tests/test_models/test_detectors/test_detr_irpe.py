"""PEDETR: grid hand-off, equivalence with DETR, losses on mixed sizes."""
import copy
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config

import mmpe  # noqa: F401
from mmpe.models.layers.irpe.irpe import iRPE

ROOT = osp.join(osp.dirname(__file__), '..', '..', '..')
QUICK_PLAIN = osp.join(ROOT, 'configs/quickstart/detr_r18_synthetic.py')
QUICK_IRPE = osp.join(ROOT, 'configs/quickstart/detr_irpe_r18_synthetic.py')


def _model_cfg(path, **enc_overrides):
    cfg = Config.fromfile(path).model
    return copy.deepcopy(cfg)


def _batch(model, shapes, training, num_items=None):
    packed = demo_mm_inputs(
        batch_size=len(shapes),
        image_shapes=shapes,
        num_items=num_items,
        num_classes=4)
    return model.data_preprocessor(packed, training)


def _build(path, seed=0, table_init=None):
    torch.manual_seed(seed)
    cfg = _model_cfg(path)
    if table_init is not None:
        cfg.encoder.layer_cfg.self_attn_cfg.rpe_cfg.init = table_init
    model = MODELS.build(cfg)
    model.init_weights()
    return model


def test_zero_tables_equal_plain_detr():
    """With zero tables, DETR-iRPE is DETR: a DETR state dict loads with
    only the RPE tables missing and gives the same predictions."""
    plain = _build(QUICK_PLAIN).eval()
    # the paper's ImageNet-side init (the configs use the DETR recipe)
    irpe = _build(QUICK_IRPE, seed=1, table_init='zeros').eval()
    result = irpe.load_state_dict(plain.state_dict(), strict=False)
    assert not result.unexpected_keys
    assert result.missing_keys and all(
        k.endswith('rpe_k.table') for k in result.missing_keys)
    assert len(result.missing_keys) == 3  # one per encoder layer
    for m in irpe.modules():
        if isinstance(m, iRPE):
            assert torch.count_nonzero(m.table) == 0

    data = _batch(plain, [(3, 96, 160), (3, 128, 80)], False)
    with torch.no_grad():
        want = plain(**data, mode='tensor')
        got = irpe(**data, mode='tensor')
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_grid_reaches_every_encoder_layer_and_decoder_untouched():
    model = _build(QUICK_IRPE)
    rpes = [m for m in model.modules() if isinstance(m, iRPE)]
    assert len(rpes) == 3
    assert all('encoder' in n for n, m in model.named_modules()
               if isinstance(m, iRPE))
    seen = []

    def spy(term):  # the attention asks each iRPE for its term of a grid
        def wrapped(x, height, width):
            seen.append((height, width))
            return term(x, height, width)
        return wrapped

    for r in rpes:
        r.term = spy(r.term)
    data = _batch(model, [(3, 96, 160), (3, 128, 80)], True)
    model(**data, mode='loss')
    # padded batch: 128 x 160 at the quick-start's stride 8 -> 16 x 20
    assert seen == [(16, 20)] * 3


def test_losses_finite_and_tables_get_gradients():
    model = _build(QUICK_IRPE).train()
    data = _batch(model, [(3, 96, 160), (3, 128, 80)], True, num_items=[3, 0])
    losses = model(**data, mode='loss')
    total = sum(v for k, v in losses.items() if 'loss' in k)
    assert torch.isfinite(total)
    total.backward()
    for m in model.modules():
        if isinstance(m, iRPE):
            assert m.table.grad is not None
            assert torch.count_nonzero(m.table.grad) > 0


def test_bucket_cache_hits_on_repeated_size():
    model = _build(QUICK_IRPE).eval()
    data = _batch(model, [(3, 112, 144), (3, 80, 144)], False)
    with torch.no_grad():
        model(**data, mode='tensor')
        before = iRPE.cache_info()
        model(**data, mode='tensor')
        after = iRPE.cache_info()
    assert after.misses == before.misses
    assert after.hits >= before.hits + 3


def test_no_absolute_pe_variant():
    cfg = _model_cfg(QUICK_IRPE)
    cfg.positional_encoding = None
    model = MODELS.build(cfg)
    model.init_weights()
    data = _batch(model, [(3, 96, 96), (3, 64, 128)], True)
    feats = model.extract_feat(data['inputs'])
    enc, dec = model.pre_transformer(feats, data['data_samples'])
    assert torch.count_nonzero(enc['feat_pos']) == 0
    assert torch.count_nonzero(dec['memory_pos']) == 0
    assert enc['spatial_shape'] == (12, 16)  # 96 x 128 at stride 8
    losses = model(**data, mode='loss')
    assert all(torch.isfinite(v).all() for v in losses.values())


def test_xavier_init_is_kept():
    cfg = _model_cfg(QUICK_IRPE)
    cfg.encoder.layer_cfg.self_attn_cfg.rpe_cfg.init = 'xavier'
    model = MODELS.build(cfg)
    model.init_weights()
    tables = [m.table for m in model.modules() if isinstance(m, iRPE)]
    assert all(torch.count_nonzero(t) > 0 for t in tables)


def test_activation_checkpointing_is_refused():
    cfg = _model_cfg(QUICK_IRPE)
    cfg.encoder.num_cp = 1
    with pytest.raises(ValueError, match='num_cp'):
        MODELS.build(cfg)
