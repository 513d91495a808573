"""Test-wide setup: mmdet's registries with the mmdet default scope (as a
config with ``default_scope='mmdet'`` gives the Runner), then mmpe."""
from mmdet.utils import register_all_modules

register_all_modules(init_default_scope=True)

import mmpe  # noqa: E402,F401
