"""Transitional old path (issue 36), removed with the backbones' import pass:
the module is :mod:`mmpe.models.layers.common.arg_checks`."""
from .common.arg_checks import *  # noqa: F401,F403
