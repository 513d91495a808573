"""mmpe: position encodings for vision transformers in MMDetection 3.x.

``import mmpe`` (or ``custom_imports=dict(imports=['mmpe'])`` in a config)
first checks the installed mmcv / mmengine / mmdet versions (see
:mod:`mmpe.utils.version_check`), then registers every mmpe module into
MMDetection's registries (mmdet scope) and, when MMSegmentation is
installed, the backbones, necks and segmentation modules into mmseg's too
(:mod:`mmpe.seg`; without mmseg, detection works as before). It patches
nothing: weights-only checkpoint loading is scoped to the tools (see
:mod:`mmpe.engine.safe_checkpoint`).
"""
from .utils.version_check import check_versions, mmseg_installed

check_versions()

from . import datasets, engine, models  # noqa: E402,F401

if mmseg_installed():
    from . import seg  # noqa: E402,F401
from .version import __version__  # noqa: E402

__all__ = ['__version__']
