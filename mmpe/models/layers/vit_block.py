"""Transitional old path (issue 36), removed with the backbones' import pass:
the module is :mod:`mmpe.models.layers.blocks.vit_block`."""
from .blocks.vit_block import *  # noqa: F401,F403
