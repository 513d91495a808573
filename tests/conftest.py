"""Test-wide setup: mmdet's registries with the mmdet default scope (as a
config with ``default_scope='mmdet'`` gives the Runner), then mmpe; the data
set check's cache (``XDG_CACHE_HOME``) in a temporary folder, for the tests
and the tools they start, never the user's; and the ``timm`` fixture: the
real timm with the torchvision stand-in of ``tests/timm_stub.py`` (why it
exists is said there)."""
import os

from mmdet.utils import register_all_modules

register_all_modules(init_default_scope=True)

import mmpe  # noqa: E402,F401

import pytest  # noqa: E402

from timm_stub import import_timm  # noqa: E402


@pytest.fixture(scope='session', autouse=True)
def _cache_in_a_temporary_folder(tmp_path_factory):
    os.environ['XDG_CACHE_HOME'] = str(tmp_path_factory.mktemp('xdg_cache'))


@pytest.fixture(scope='session')
def timm():
    """The real timm (random weights only: ``pretrained=False``), imported
    with the torchvision stand-in of ``tests/timm_stub.py``."""
    return import_timm()
