"""Transitional old path (issue 36), removed with the backbones' import pass:
the module is :mod:`mmpe.models.layers.encodings.pos_embed_2d`."""
from .encodings.pos_embed_2d import *  # noqa: F401,F403
