"""Transitional old path (issue 36), removed with the backbones' import pass:
the module is :mod:`mmpe.models.layers.encodings.rope2d`."""
from .encodings.rope2d import *  # noqa: F401,F403
