"""LrFactorOptimWrapperConstructor: every parameter's lr and weight decay
against detectron2's ``get_default_optimizer_params`` rule written out here
(norm layers' parameters at ``weight_decay_norm``, every lr times
``lr_factor_func(module_name + '.' + param_name)``), with the factor
function given as detectron2 / detrex write it; the longest path decides;
MMEngine's own rules (``custom_keys``) apply first; bad factors are refused
by name."""
import pytest
import torch
from mmengine.optim import build_optim_wrapper
from torch import nn

BASE_LR, WD = 1e-4, 1e-4
#: detectron2's norm module types (solver/build.py)
NORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
              nn.GroupNorm, nn.InstanceNorm1d, nn.InstanceNorm2d,
              nn.InstanceNorm3d, nn.LayerNorm, nn.LocalResponseNorm)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8))
        self.neck = nn.ModuleDict(
            dict(pyramid=nn.Conv2d(8, 8, 1),
                 out_convs=nn.Sequential(nn.Conv2d(8, 8, 1),
                                         nn.GroupNorm(2, 8))))
        self.necklace = nn.Linear(8, 8)  # not under 'neck'
        self.head = nn.Sequential(nn.Linear(8, 2), nn.BatchNorm1d(2))


def detectron2_groups(model, lr_factor_func, weight_decay_norm=0.):
    """{parameter name: (lr, weight decay)} by detectron2's loop."""
    out = {}
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            name = f'{module_name}.{param_name}'
            wd = weight_decay_norm if isinstance(module, NORM_TYPES) else WD
            out[name] = (BASE_LR * lr_factor_func(name), wd)
    return out


def built_groups(model, paramwise_cfg):
    optim = build_optim_wrapper(
        model,
        dict(
            constructor='LrFactorOptimWrapperConstructor',
            optimizer=dict(type='AdamW', lr=BASE_LR, weight_decay=WD),
            paramwise_cfg=paramwise_cfg)).optimizer
    by_param = {}
    for group in optim.param_groups:
        for p in group['params']:
            assert id(p) not in by_param
            by_param[id(p)] = (group['lr'], group['weight_decay'])
    return {n: by_param[id(p)] for n, p in model.named_parameters()}


def _assert_groups(got, want):
    assert set(got) == set(want)
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-12), name


def test_detrex_dino_rule():
    """detrex's DETRs: ``0.1 if "backbone" in name else 1``, norms at 0."""
    model = Model()
    got = built_groups(
        model, dict(norm_decay_mult=0., lr_factors={'backbone': 0.1}))
    want = detectron2_groups(model,
                             lambda n: 0.1 if 'backbone' in n else 1)
    _assert_groups(got, want)
    assert got['backbone.1.weight'] == (pytest.approx(1e-5), 0.)
    assert got['backbone.0.weight'] == (pytest.approx(1e-5), WD)
    assert got['head.0.weight'] == (pytest.approx(1e-4), WD)


def test_longest_path_decides_and_paths_stop_at_dots():
    """The neck at x 0.1 but its out_convs at x 1 (detrex's DINO-ViTDet:
    the pyramid in its backbone, the channel mapper in its neck);
    'neck' is no prefix of 'necklace'."""
    model = Model()
    got = built_groups(
        model,
        dict(norm_decay_mult=0.,
             lr_factors={'backbone': 0.1, 'neck': 0.1,
                         'neck.out_convs': 1.0}))

    def factor(name):
        if name.startswith('neck.out_convs.'):
            return 1
        return 0.1 if name.startswith(('backbone.', 'neck.')) else 1

    _assert_groups(got, detectron2_groups(model, factor))
    assert got['neck.pyramid.weight'][0] == pytest.approx(1e-5)
    assert got['neck.out_convs.1.weight'] == (pytest.approx(1e-4), 0.)
    assert got['necklace.weight'][0] == pytest.approx(1e-4)


def test_custom_keys_apply_first():
    """An MMEngine ``custom_keys`` entry sets its lr / decay multipliers
    (and, as MMEngine does, replaces the norm rule for what it matches);
    the factor multiplies the result."""
    model = Model()
    got = built_groups(
        model,
        dict(norm_decay_mult=0.,
             custom_keys={'backbone.1': dict(lr_mult=2., decay_mult=1.)},
             lr_factors={'backbone': 0.1}))
    assert got['backbone.1.weight'] == (pytest.approx(2e-5), WD)
    assert got['backbone.0.weight'] == (pytest.approx(1e-5), WD)


@pytest.mark.parametrize('factors,match', [
    (None, 'lr_factors` None'),
    ({}, 'lr_factors` {}'),
    ({'backbone': 0}, r"lr_factors\['backbone'\]` 0, please choose a "
     'positive'),
    ({'backbone': -0.1}, 'positive'),
    ({'backbone': True}, r"lr_factors\['backbone'\]` True"),
    ({'backbone': '0.1'}, 'positive'),
    ({'': 0.1}, "key '', please give a module path"),
    ({'backbone.': 0.1}, "key 'backbone.'"),
    ({'neck.out_conv': 1.0}, r"\['neck.out_conv'\] name no parameter of "
     r"Model \(its modules: \['backbone', 'neck', 'necklace', 'head'\]\)"),
])
def test_bad_factors_are_refused(factors, match):
    cfg = dict(norm_decay_mult=0.)
    if factors is not None:
        cfg['lr_factors'] = factors
    with pytest.raises(ValueError, match=match):
        built_groups(Model(), cfg)
