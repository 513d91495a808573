"""RTDETREMA against the RT-DETR authors' ModelEMA formula written here.

lyuwenyu/RT-DETR ``rtdetrv2_pytorch/src/optim/ema.py``: after the t-th
optimiser step (t = 1, 2, ...) every floating-point entry of the state dict
becomes ``d * ema + (1 - d) * model`` with
``d = decay * (1 - exp(-t / warmups))``; integer entries are left as copied.
"""
import copy
import math
import types

import pytest
import torch
from mmengine.hooks import EMAHook
from mmengine.model import ExponentialMovingAverage
from torch import nn

from mmpe.engine import RTDETREMA

# float32 in-place updates against the reference's out-of-place ones
ATOL = 1e-6


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Flatten(), nn.LazyLinear(2))


def _step(model, t):
    """A stand-in optimiser step: the weights move, BN's statistics too."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.train()
    model(torch.randn(2, 3, 6, 6) + t)


def _reference(initial, states, decay, warmups):
    ema = {k: v.clone() for k, v in initial.items()}
    for t, state in enumerate(states, start=1):
        d = decay * (1 - math.exp(-t / warmups))
        for k, v in ema.items():
            if v.dtype.is_floating_point:
                ema[k] = d * v + (1 - d) * state[k]
    return ema


@pytest.mark.parametrize('decay,warmups', [(0.9999, 2000), (0.9, 3)])
def test_update_follows_the_authors_formula(decay, warmups):
    model = _model()
    model(torch.randn(1, 3, 6, 6))  # materialise the lazy layer
    initial = copy.deepcopy(model.state_dict())
    ema = RTDETREMA(model, decay=decay, warmups=warmups)
    states = []
    for t in range(6):
        _step(model, t)
        states.append(copy.deepcopy(model.state_dict()))
        ema.update_parameters(model)
    expected = _reference(initial, states, decay, warmups)
    got = ema.module.state_dict()
    for k, v in expected.items():
        torch.testing.assert_close(got[k], v, atol=ATOL, rtol=0, msg=k)
    assert int(ema.steps) == 6
    # buffers averaged (the authors'), the integer counter as copied
    assert not torch.allclose(got['1.running_mean'],
                              model.state_dict()['1.running_mean'])
    assert int(got['1.num_batches_tracked']) == int(
        initial['1.num_batches_tracked'])


def test_controls_differ():
    """MMEngine's EMA (copy at the first update, constant momentum) and a
    decay without the ramp do not give the authors' average."""
    model = _model()
    model(torch.randn(1, 3, 6, 6))
    initial = copy.deepcopy(model.state_dict())
    ours = RTDETREMA(model, decay=0.9, warmups=3)
    theirs = ExponentialMovingAverage(model, momentum=0.1,
                                      update_buffers=True)
    states = []
    for t in range(4):
        _step(model, t)
        states.append(copy.deepcopy(model.state_dict()))
        ours.update_parameters(model)
        theirs.update_parameters(model)
    no_ramp = _reference(initial, states, 0.9, 1e-9)  # d = 0.9 throughout
    key = '0.weight'
    got = ours.module.state_dict()[key]
    assert not torch.allclose(got, theirs.module.state_dict()[key])
    assert not torch.allclose(got, no_ramp[key])


def test_built_by_mmengine_ema_hook():
    """``EMAHook(ema_type='RTDETREMA', ...)`` builds it (mmdet scope) and its
    iteration hook updates it."""
    model = _model()
    model(torch.randn(1, 3, 6, 6))
    hook = EMAHook(ema_type='RTDETREMA', decay=0.99, warmups=10)
    runner = types.SimpleNamespace(model=model, iter=0, epoch=0)
    hook.before_run(runner)
    assert isinstance(hook.ema_model, RTDETREMA)
    assert hook.ema_model.update_buffers
    initial = copy.deepcopy(model.state_dict())
    _step(model, 0)
    hook.after_train_iter(runner, 0)
    d = 0.99 * (1 - math.exp(-1 / 10))
    expected = d * initial['0.weight'] + (1 - d) * model.state_dict()[
        '0.weight']
    torch.testing.assert_close(
        hook.ema_model.module.state_dict()['0.weight'], expected,
        atol=ATOL, rtol=0)


@pytest.mark.parametrize('kwargs,field', [
    (dict(decay=1.0), 'decay'),
    (dict(decay=True), 'decay'),
    (dict(warmups=0), 'warmups'),
    (dict(warmups=2.5), 'warmups'),
    (dict(interval=2), 'interval'),
])
def test_bad_arguments_named(kwargs, field):
    with pytest.raises(ValueError, match=f'`{field}`'):
        RTDETREMA(nn.Linear(2, 2), **kwargs)
