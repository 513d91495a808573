"""Moved to :mod:`mmpe.models.layers.irpe.index` (this path is kept)."""
from .irpe.index import (INDEX_FUNCS, METHODS, DeviceType, axis_bucket_tables,
                         clip_index, get_bucket_ids_2d, get_index_func,
                         get_num_buckets, max_index, num_buckets_per_table,
                         piecewise_index, ratio_to_abg, relative_index_1d,
                         relative_offsets_1d, spatial_bucket_ids)
