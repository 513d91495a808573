"""Transitional old path (issue 36), removed with the backbones' import pass:
the module is :mod:`mmpe.models.layers.common.tracing`."""
from .common.tracing import *  # noqa: F401,F403
