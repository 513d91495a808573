from .attention_terms import RelativeTerm, register_term
from .box_rpb import AxisBiasTerm, BoxRPB
from .cache import BoundedCache, CacheInfo
from .cross_attention import BiasedConditionalAttention, CrossPEAttention
from .irpe import iRPE
from .irpe_attention import iRPEMultiheadAttention
from .irpe_index import (axis_bucket_tables, clip_index, get_bucket_ids_2d,
                         get_num_buckets, num_buckets_per_table,
                         piecewise_index, ratio_to_abg, relative_index_1d)
from .irpe_terms import IRPETerm
from .pe_attention import PEAttention
from .peg import PEG
from .rel_pos import DecomposedRelPos, DecomposedRelPosTerm, resize_rel_pos
from .pos_embed_2d import (SinCosPosEmbed2D, build_sincos_pos_embed_2d,
                           resample_pos_embed)
from .rope2d import RoPE2D, apply_rope2d, build_rope2d
from .rope_mixed import RoPEMixed, init_mixed_freqs
from .tracing import is_tracing
from .vit_block import Mlp, ViTAttention, ViTBlock
from .window import (merge_windows, partition_grid, unpartition_grid,
                     window_grid, window_key_mask, window_table, window_tokens)

__all__ = [
    'iRPE', 'piecewise_index', 'clip_index', 'ratio_to_abg',
    'relative_index_1d', 'axis_bucket_tables', 'get_bucket_ids_2d',
    'get_num_buckets', 'num_buckets_per_table', 'iRPEMultiheadAttention',
    'PEAttention', 'ViTAttention', 'ViTBlock', 'Mlp', 'PEG', 'BoundedCache',
    'CacheInfo', 'SinCosPosEmbed2D', 'build_sincos_pos_embed_2d',
    'resample_pos_embed', 'RoPE2D', 'apply_rope2d', 'build_rope2d',
    'RoPEMixed', 'init_mixed_freqs', 'is_tracing', 'RelativeTerm',
    'register_term', 'IRPETerm', 'DecomposedRelPos', 'DecomposedRelPosTerm',
    'resize_rel_pos',
    'merge_windows',
    'partition_grid', 'unpartition_grid', 'window_grid', 'window_key_mask',
    'window_table', 'window_tokens', 'AxisBiasTerm', 'BoxRPB',
    'BiasedConditionalAttention', 'CrossPEAttention'
]
