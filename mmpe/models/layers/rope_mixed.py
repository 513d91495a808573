"""Transitional old path (issue 36), removed with the backbones' import pass:
the module is :mod:`mmpe.models.layers.encodings.rope_mixed`."""
from .encodings.rope_mixed import *  # noqa: F401,F403
