"""Import the real timm in tests, with an import-only stand-in for torchvision.

Why the stand-in exists: ``import timm`` imports torchvision (for data
transforms, datasets and ``FrozenBatchNorm2d``), but no torchvision on PyPI
loads beside the CPU build of torch 2.13 (its compiled ops fail with
"operator torchvision::nms does not exist"). timm's model code (ViT, DeiT)
never calls torchvision, so the tests install timm with ``--no-deps`` (see
``tools/setup_env.sh``) and give it, during ``import timm`` only, empty
modules that hold just the names timm reads at import time (timm 1.0.31).
Anything of them that is *used* raises, so a test can never silently run
on stand-in code.

Use the ``timm`` fixture of ``tests/conftest.py``, or::

    from timm_stub import import_timm
    timm = import_timm()
    model = timm.create_model('deit_tiny_patch16_224', pretrained=False)

A torchvision that does import (e.g. a CUDA torch with its matching
torchvision) is used as is.
"""
import enum
import importlib
import importlib.util
import sys
import types
from contextlib import contextmanager

import torch


class _Unavailable:
    """Base of every stand-in class: timm may subclass or isinstance-check
    it at import, but building one means a test reached torchvision code."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(
            f'{type(self).__name__} comes from the test stand-in for '
            'torchvision (tests/timm_stub.py); the real one does not load '
            'beside this CPU torch')


class _UnavailableModule(_Unavailable, torch.nn.Module):
    pass


class _InterpolationMode(enum.Enum):
    """torchvision.transforms.functional.InterpolationMode's members; timm
    builds name tables from them at import."""
    NEAREST = 'nearest'
    NEAREST_EXACT = 'nearest-exact'
    BILINEAR = 'bilinear'
    BICUBIC = 'bicubic'
    BOX = 'box'
    HAMMING = 'hamming'
    LANCZOS = 'lanczos'


def _stub_modules():
    """{module name: module} for the stand-in; only the names timm 1.0.31
    imports unconditionally (optional ones, e.g. feature_extraction,
    Places365, are left out so timm's own ``except ImportError`` runs)."""

    def module(name, **attrs):
        mod = types.ModuleType(name, 'test stand-in, see tests/timm_stub.py')
        mod.__path__ = []  # a package: no submodule is found on disk
        for key, value in attrs.items():
            setattr(mod, key, value)
        return mod

    def unavailable(name, base=_Unavailable):
        return type(name, (base, ), {})

    functional = module(
        'torchvision.transforms.functional',
        InterpolationMode=_InterpolationMode)
    transforms = module(
        'torchvision.transforms',
        functional=functional,
        ToTensor=unavailable('ToTensor'))
    datasets = module(
        'torchvision.datasets', **{
            name: unavailable(name)
            for name in ('CIFAR10', 'CIFAR100', 'MNIST', 'KMNIST',
                         'FashionMNIST', 'ImageFolder')
        })
    misc = module(
        'torchvision.ops.misc',
        FrozenBatchNorm2d=unavailable('FrozenBatchNorm2d',
                                      _UnavailableModule))
    ops = module('torchvision.ops', misc=misc)
    root = module(
        'torchvision', transforms=transforms, datasets=datasets, ops=ops)
    mods = (root, transforms, functional, datasets, ops, misc)
    return {mod.__name__: mod for mod in mods}


def _drop(prefix):
    for name in [n for n in sys.modules
                 if n == prefix or n.startswith(prefix + '.')]:
        del sys.modules[name]


def _torchvision_imports():
    if importlib.util.find_spec('torchvision') is None:
        return False
    try:
        importlib.import_module('torchvision')
        return True
    except Exception:  # RuntimeError from its compiled ops, ImportError
        _drop('torchvision')  # leave no half-imported package behind
        return False


@contextmanager
def _torchvision_stand_in():
    """The stand-in in ``sys.modules`` for the ``with`` body, then gone, so
    nothing after ``import timm`` sees a torchvision that is not there."""
    stubs = _stub_modules()
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for name, mod in stubs.items():
            if sys.modules.get(name) is mod:
                del sys.modules[name]


def import_timm():
    """The real ``timm`` module (installed with ``--no-deps``), imported
    with the torchvision stand-in where the real torchvision cannot load.

    Raises:
        ImportError: timm is not installed (it is a test dependency:
            ``bash tools/setup_env.sh tests``).
    """
    if 'timm' in sys.modules:
        return sys.modules['timm']
    if importlib.util.find_spec('timm') is None:
        raise ImportError('timm is a test dependency and is not installed; '
                          'run `bash tools/setup_env.sh tests`')
    if _torchvision_imports():
        return importlib.import_module('timm')
    _drop('timm')  # a failed earlier `import timm` leaves pieces behind
    with _torchvision_stand_in():
        return importlib.import_module('timm')
