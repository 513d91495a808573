"""``SegLabelCheckHook``: the data set check under the name segmentation
configs used before :class:`~mmpe.engine.DatasetCheckHook` covered every
task.

It is :class:`~mmpe.engine.DatasetCheckHook` (same mechanism, report and
exit status 2; see :mod:`mmpe.datasets.data_check.label_maps` for what a
label map must satisfy), registered in mmseg's registry under this name,
and by default checks the train and val sets only, as it did::

    custom_hooks = [dict(type='SegLabelCheckHook', ignore_index=255)]

``configs/_base_/runtime_mmpe.py`` declares ``DatasetCheckHook``; a config
that lists ``SegLabelCheckHook`` instead does not get a second check.
"""
from typing import Sequence

from mmseg.registry import HOOKS

from ..datasets.data_check.label_maps import label_problems, load_label_map
from ..engine.dataset_check_hook import DatasetCheckHook


@HOOKS.register_module()
class SegLabelCheckHook(DatasetCheckHook):
    """:class:`~mmpe.engine.DatasetCheckHook` checking the train and val
    sets by default.

    Args:
        ignore_index (int): The value the decode head and metric ignore.
            Defaults to 255.
        splits (Sequence[str]): Which of ``'train'``, ``'val'``, ``'test'``
            to check. Defaults to ``('train', 'val')``.
        **kwargs: The other arguments of ``DatasetCheckHook``.
    """

    def __init__(self, ignore_index: int = 255,
                 splits: Sequence[str] = ('train', 'val'), **kwargs) -> None:
        super().__init__(ignore_index=ignore_index, splits=splits, **kwargs)


__all__ = ['SegLabelCheckHook', 'label_problems', 'load_label_map']
