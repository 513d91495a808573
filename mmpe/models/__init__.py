"""Models: position-encoding layers, backbones, necks, heads and detectors.

Importing this package registers every module into MMDetection's ``MODELS``.
"""
from .backbones import *  # noqa: F401,F403
from .dense_heads import *  # noqa: F401,F403
from .detectors import *  # noqa: F401,F403
from .layers import *  # noqa: F401,F403
from .necks import *  # noqa: F401,F403
from .utils import *  # noqa: F401,F403
