"""Kept old path (docs name it) of :mod:`.irpe.index`, :mod:`.irpe.buckets`."""
from .irpe.buckets import (axis_bucket_tables, get_bucket_ids_2d,
                           spatial_bucket_ids)
from .irpe.index import (INDEX_FUNCS, METHODS, DeviceType, clip_index,
                         get_index_func, get_num_buckets, max_index,
                         num_buckets_per_table, piecewise_index, ratio_to_abg,
                         relative_index_1d, relative_offsets_1d)
