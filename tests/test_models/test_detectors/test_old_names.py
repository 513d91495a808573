"""The names before the rename (``iRPEDETR`` and its kin carry RoPE or no
encoding as well, hence ``PEDETR``, ``PEMultiheadAttention``, ...): configs
that name the old registry types still build the same classes, Python
imports of the old names still work, and a state dict saved from a model
built under an old name loads strictly into the new one and computes the
same outputs (no parameter was renamed)."""
import copy
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config

import mmpe  # noqa: F401  (registers the modules)
from mmpe.models import detectors, layers

ROOT = osp.join(osp.dirname(__file__), '..', '..', '..')
#: old registry name -> new one
REGISTRY = {
    'iRPEDETR': 'PEDETR',
    'iRPEConditionalDETR': 'PEConditionalDETR',
    'iRPEDABDETR': 'PEDABDETR',
    'iRPEMultiheadAttention': 'PEMultiheadAttention',
}
#: old Python name -> new one, per package
PYTHON = {
    detectors: ('iRPEDETR', 'iRPEConditionalDETR', 'iRPEDABDETR',
                'iRPEEncoderMixin', 'iRPEDetrTransformerEncoder',
                'iRPEDetrTransformerEncoderLayer',
                'iRPEDABDetrTransformerEncoder'),
    layers: ('iRPEMultiheadAttention', ),
}


@pytest.mark.parametrize('old', REGISTRY)
def test_old_registry_names_are_the_new_classes(old):
    new = REGISTRY[old]
    assert MODELS.get(old) is MODELS.get(new)
    assert MODELS.get(new).__name__ == new


@pytest.mark.parametrize('package', PYTHON, ids=lambda p: p.__name__)
def test_old_python_names_are_the_new_classes(package):
    for old in PYTHON[package]:
        new = 'PE' + old[len('iRPE'):]
        assert getattr(package, old) is getattr(package, new), old
        assert old in package.__all__ and new in package.__all__


def _batch(model, shapes):
    packed = demo_mm_inputs(batch_size=len(shapes), image_shapes=shapes,
                            num_classes=4)
    return model.data_preprocessor(packed, False)


def _built(cfg, type_name, seed):
    cfg = copy.deepcopy(cfg)
    cfg.type = type_name
    torch.manual_seed(seed)
    model = MODELS.build(cfg)
    model.init_weights()
    return model.eval()


@pytest.mark.parametrize('config,old', [
    ('configs/quickstart/detr_irpe_r18_synthetic.py', 'iRPEDETR'),
    ('configs/quickstart/detr_rope-mixed_r18_synthetic.py', 'iRPEDETR'),
    ('configs/quickstart/conditional-detr_irpe_r18_synthetic.py',
     'iRPEConditionalDETR'),
    ('configs/quickstart/dab-detr_irpe_r18_synthetic.py', 'iRPEDABDETR'),
])
def test_state_dict_of_an_old_name_loads_into_the_new(config, old):
    cfg = Config.fromfile(osp.join(ROOT, config)).model
    assert cfg.type == REGISTRY[old]  # the configs name the new types
    before = _built(cfg, old, seed=0)
    saved = copy.deepcopy(before.state_dict())
    after = _built(cfg, REGISTRY[old], seed=1)  # other weights until loaded
    assert list(after.state_dict()) == list(saved)
    after.load_state_dict(saved, strict=True)
    data = _batch(before, [(3, 96, 128), (3, 64, 96)])
    with torch.no_grad():
        want = before(**data, mode='tensor')
        got = after(**data, mode='tensor')
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_attention_of_the_old_name_loads_into_the_new():
    """The layer alone, as a config would name it (iRPE on q, k, v)."""
    cfg = dict(embed_dims=16, num_heads=2, rpe_on='qkv',
               rpe_cfg=dict(mode='contextual', method='product',
                            init='trunc_normal'))
    torch.manual_seed(0)
    before = MODELS.build(dict(cfg, type='iRPEMultiheadAttention')).eval()
    torch.manual_seed(1)
    after = MODELS.build(dict(cfg, type='PEMultiheadAttention')).eval()
    assert type(before) is type(after) is layers.PEMultiheadAttention
    after.load_state_dict(before.state_dict(), strict=True)
    x = torch.randn(12, 2, 16)  # (L, B, C): a 3 x 4 grid
    with torch.no_grad():
        torch.testing.assert_close(
            after(x, spatial_shape=(3, 4)), before(x, spatial_shape=(3, 4)),
            atol=0, rtol=0)
