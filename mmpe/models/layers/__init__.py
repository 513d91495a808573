"""mmpe's layers: position encodings and the one attention they act in.

Packages, bottom up, with their floors (a package imports only lower
floors; docs/design.md, "Import floors", numbers them): 3 ``common``
(tracing, caches, argument checks); 4 ``terms`` (the relative-term
interface), ``encodings`` (absolute, rotary and conv position encodings),
``windows`` (ViTDet's window layout); 5 ``irpe`` (index functions, bucket
tables, expansion plans, the iRPE module and its term), ``box`` (BoxRPB,
the per-axis box-to-pixel bias of decoder cross-attention),
``grid_bias`` (per-head biases of the grid offset: Swin-V2's log-CPB, 2D
ALiBi, LookHere); 6
``decomposed`` (ViTDet's decomposed relative position); 7 ``attention``
(the attention core and its backends); 8 ``blocks`` (the mmcv and timm
layouts around the core), ``rtdetr`` (RT-DETR's decoder side: deformable
cross-attention v2, decoder, denoising groups, anchors).
"""
from .attention.core import PEAttention
from .attention.cross import BiasedConditionalAttention, CrossPEAttention
from .blocks.multihead_attention import PEMultiheadAttention
from .blocks.vit_block import Mlp, ViTAttention, ViTBlock
from .box.box_rpb import AxisBiasTerm, BoxRPB
from .common.cache import BoundedCache, CacheInfo
from .common.tracing import is_tracing
from .decomposed.rel_pos import (DecomposedRelPos, DecomposedRelPosTerm,
                                 resize_rel_pos)
from .encodings.peg import PEG
from .encodings.pos_embed_2d import (SinCosPosEmbed2D,
                                     build_sincos_pos_embed_2d,
                                     resample_pos_embed)
from .encodings.rope2d import RoPE2D, apply_rope2d, build_rope2d
from .encodings.rope_coords import RoPECoords
from .encodings.rope_mixed import RoPEMixed, init_mixed_freqs
from .grid_bias.alibi_2d import ALiBi2D
from .grid_bias.log_cpb import LogCPB
from .grid_bias.lookhere import LookHere
from .grid_bias.offset_term import OffsetBias, OffsetBiasTerm
from .irpe.buckets import axis_bucket_tables, get_bucket_ids_2d
from .irpe.index import (clip_index, get_num_buckets, num_buckets_per_table,
                         piecewise_index, ratio_to_abg, relative_index_1d)
from .irpe.irpe import iRPE
from .irpe.terms import IRPETerm
from .rtdetr import (DenoisingGroups, MSDeformableAttentionV2,
                     RTDETRDecoder, RTDETRDecoderLayer,
                     contrastive_denoising_groups, deformable_sample,
                     rtdetr_anchors)
from .terms.registry import register_term
from .terms.relative_term import AxisValues, RelativeTerm
from .windows.window import (merge_windows, partition_grid, unpartition_grid,
                             window_grid, window_key_mask, window_table,
                             window_tokens)

#: the name before the rename (it also carries RoPE, or nothing)
iRPEMultiheadAttention = PEMultiheadAttention

__all__ = [
    'iRPE', 'piecewise_index', 'clip_index', 'ratio_to_abg',
    'relative_index_1d', 'axis_bucket_tables', 'get_bucket_ids_2d',
    'get_num_buckets', 'num_buckets_per_table', 'PEMultiheadAttention',
    'iRPEMultiheadAttention',
    'PEAttention', 'ViTAttention', 'ViTBlock', 'Mlp', 'PEG', 'BoundedCache',
    'CacheInfo', 'SinCosPosEmbed2D', 'build_sincos_pos_embed_2d',
    'resample_pos_embed', 'RoPE2D', 'apply_rope2d', 'build_rope2d',
    'RoPEMixed', 'init_mixed_freqs', 'RoPECoords', 'is_tracing',
    'RelativeTerm', 'register_term', 'AxisValues', 'IRPETerm',
    'DecomposedRelPos', 'DecomposedRelPosTerm', 'resize_rel_pos',
    'merge_windows', 'partition_grid', 'unpartition_grid', 'window_grid',
    'window_key_mask', 'window_table', 'window_tokens', 'AxisBiasTerm',
    'BoxRPB', 'BiasedConditionalAttention', 'CrossPEAttention', 'LogCPB',
    'ALiBi2D', 'LookHere', 'OffsetBias', 'OffsetBiasTerm',
    'DenoisingGroups', 'MSDeformableAttentionV2', 'RTDETRDecoder',
    'RTDETRDecoderLayer', 'contrastive_denoising_groups',
    'deformable_sample', 'rtdetr_anchors'
]
