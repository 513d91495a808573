"""mmpe in MMSegmentation: registration and the segmentation-only modules.

Imported by ``import mmpe`` when mmseg is installed (``mmpe/__init__.py``);
without mmseg, ``import mmpe`` works as before and only mmseg configs are
unavailable. :func:`register_in_mmseg` puts mmpe's backbone and neck (and the
runtime pieces of ``configs/_base_/runtime_mmpe.py``: the loop and the
hooks, and the optimizer wrapper ``--amp`` offers; ``MMPERunner`` is in
MMEngine's root registry, which every scope sees) into mmseg's
registries as well, so configs with ``default_scope='mmseg'`` write
``type='CPVT'`` or ``type='PreemptionHook'`` with
``custom_imports=dict(imports=['mmpe'])``. The
same classes stay in mmdet's registries: detection configs see no change.
The modules of this package register into mmseg's registries themselves:

- :class:`PaddingAwareEncoderDecoder` (``padding_aware_seg.py``): the
  backbone gets each batch's padding mask;
- :class:`SyntheticSegDataset` (``synthetic_seg_dataset.py``): the embedded
  set's label maps;
- :class:`SegLabelCheckHook` (``label_check.py``): the data set check
  (:class:`~mmpe.engine.DatasetCheckHook`) under its earlier name.
"""
from mmseg.registry import HOOKS, LOOPS, MODELS, OPTIM_WRAPPERS

from ..engine import (AtomicCheckpointHook, AutocastOptimWrapper,
                      DatasetCheckHook, PlainCheckpointHook,
                      PlainParamGroupsHook, PreemptionHook,
                      ResumableEpochBasedTrainLoop, RNGStateHook)
from ..models.backbones import CPVT
from ..models.necks import ViTSimpleFPN
from .label_check import SegLabelCheckHook, label_problems
from .padding_aware_seg import PaddingAwareEncoderDecoder
from .synthetic_seg_dataset import SyntheticSegDataset

#: (mmseg registry, mmpe classes registered there under their own names)
SHARED = ((MODELS, (CPVT, ViTSimpleFPN)),
          (HOOKS, (AtomicCheckpointHook, DatasetCheckHook,
                   PlainCheckpointHook, PlainParamGroupsHook, PreemptionHook,
                   RNGStateHook)),
          (LOOPS, (ResumableEpochBasedTrainLoop, )),
          (OPTIM_WRAPPERS, (AutocastOptimWrapper, )))


def register_in_mmseg() -> None:
    """Register mmpe's shared modules into mmseg's registries.

    Idempotent (a class already there under its name is left alone).

    Raises:
        KeyError: If mmseg's registry holds another class under one of the
            names.
    """
    for registry, classes in SHARED:
        for cls in classes:
            found = registry.module_dict.get(cls.__name__)
            if found is cls:
                continue
            if found is not None:
                raise KeyError(
                    f'mmseg registry {registry.name!r} already has a '
                    f'{cls.__name__!r} ({found.__module__}); mmpe cannot '
                    'register its own there')
            registry.register_module(module=cls)


register_in_mmseg()

__all__ = [
    'PaddingAwareEncoderDecoder', 'SegLabelCheckHook', 'SyntheticSegDataset',
    'label_problems', 'register_in_mmseg'
]
