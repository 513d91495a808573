"""mmpe: position encodings for vision transformers in MMDetection 3.x.

``import mmpe`` (or ``custom_imports=dict(imports=['mmpe'])`` in a config)
registers every mmpe module into MMDetection's registries (mmdet scope) and
makes checkpoints load weights-only (see :mod:`mmpe.engine`).
"""
from . import engine  # noqa: F401  (first: safe checkpoints)
from . import datasets, models  # noqa: F401
from .version import __version__

__all__ = ['__version__']
