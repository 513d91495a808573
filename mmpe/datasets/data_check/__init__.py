"""The data set check: every file and annotation a run will read, checked
before its first step (:class:`mmpe.engine.DatasetCheckHook`,
``tools/analysis/check_dataset.py``); see :mod:`.checker`."""
from .checker import (DEFAULT_CACHE, CheckOptions, CheckResult,
                      check_dataset)
from .coco_annotations import check_coco
from .file_cache import FileCheckCache, default_cache_dir
from .image_files import (ImageReadSettings, check_image_file,
                          eoi_repair_command, jpeg_data_complete)
from .label_maps import (label_problems, label_size_reason,
                         label_value_reason, load_label_map, read_label_map)
from .problems import Problem, format_report, summary_by_kind

__all__ = [
    'CheckOptions', 'CheckResult', 'DEFAULT_CACHE', 'FileCheckCache',
    'ImageReadSettings', 'Problem', 'check_coco', 'check_dataset',
    'check_image_file', 'default_cache_dir', 'eoi_repair_command',
    'format_report', 'jpeg_data_complete', 'label_problems',
    'label_size_reason', 'label_value_reason', 'load_label_map',
    'read_label_map', 'summary_by_kind'
]
