"""mmseg data set of the synthetic shapes' semantic label maps.

The images of the embedded COCO-format set (``train/``, ``val/``) and the
label maps :func:`mmpe.datasets.generate_synthetic_seg` writes beside them
(``seg_maps/train/``, ``seg_maps/val/``): five classes, background (0)
included (``reduce_zero_label=False``). A missing folder is reported with
the command that makes it, before mmseg lists files.
"""
import os.path as osp

from mmseg.datasets import BaseSegDataset
from mmseg.registry import DATASETS
from ..datasets.synthetic_seg import (SYNTHETIC_SEG_CLASSES,
                                      SYNTHETIC_SEG_PALETTE)

MAKE_HINT = ('generate it with: python '
             'tools/dataset_converters/make_synthetic_seg.py --out-dir {root}')


@DATASETS.register_module()
class SyntheticSegDataset(BaseSegDataset):
    """The synthetic shapes as semantic segmentation (mmseg layout).

    Args:
        data_prefix (dict): ``img_path`` and ``seg_map_path`` folders under
            ``data_root``, e.g. ``dict(img_path='train',
            seg_map_path='seg_maps/train')``.
        **kwargs: Other ``BaseSegDataset`` arguments.
    """

    METAINFO = dict(
        classes=SYNTHETIC_SEG_CLASSES, palette=SYNTHETIC_SEG_PALETTE)

    def __init__(self,
                 img_suffix: str = '.jpg',
                 seg_map_suffix: str = '.png',
                 reduce_zero_label: bool = False,
                 **kwargs) -> None:
        super().__init__(
            img_suffix=img_suffix,
            seg_map_suffix=seg_map_suffix,
            reduce_zero_label=reduce_zero_label,
            **kwargs)

    def load_data_list(self):
        for key in ('img_path', 'seg_map_path'):
            folder = self.data_prefix.get(key, '')
            if not osp.isdir(folder):
                raise FileNotFoundError(
                    f'{type(self).__name__}: {key} folder {folder!r} does '
                    'not exist; ' + MAKE_HINT.format(
                        root=self.data_root or '.'))
        return super().load_data_list()
