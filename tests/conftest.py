"""Test-wide setup: mmdet's registries with the mmdet default scope (as a
config with ``default_scope='mmdet'`` gives the Runner), then mmpe; and the
``timm`` fixture: the real timm with the torchvision stand-in of
``tests/timm_stub.py`` (why it exists is said there)."""
from mmdet.utils import register_all_modules

register_all_modules(init_default_scope=True)

import mmpe  # noqa: E402,F401

import pytest  # noqa: E402

from timm_stub import import_timm  # noqa: E402


@pytest.fixture(scope='session')
def timm():
    """The real timm (random weights only: ``pretrained=False``), imported
    with the torchvision stand-in of ``tests/timm_stub.py``."""
    return import_timm()
