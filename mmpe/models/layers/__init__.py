from .irpe import iRPE
from .irpe_attention import iRPEMultiheadAttention
from .irpe_index import (clip_index, get_bucket_ids_2d, get_num_buckets,
                         num_buckets_per_table, piecewise_index,
                         ratio_to_abg, relative_index_1d)
from .peg import PEG
from .pos_embed_2d import (BoundedCache, SinCosPosEmbed2D,
                           build_sincos_pos_embed_2d, resample_pos_embed)
from .rope2d import RoPE2D, apply_rope2d, build_rope2d

__all__ = [
    'iRPE', 'piecewise_index', 'clip_index', 'ratio_to_abg',
    'relative_index_1d', 'get_bucket_ids_2d', 'get_num_buckets',
    'num_buckets_per_table', 'iRPEMultiheadAttention',
    'PEG', 'BoundedCache', 'SinCosPosEmbed2D', 'build_sincos_pos_embed_2d',
    'resample_pos_embed', 'RoPE2D', 'apply_rope2d', 'build_rope2d'
]
