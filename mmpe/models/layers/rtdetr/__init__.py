"""Floor 8: RT-DETR's decoder side: deformable cross-attention v2 with
per-level point counts, the decoder layer and decoder with iterative box
refinement, the contrastive denoising groups and the query anchors."""
from .anchors import rtdetr_anchors
from .decoder import RTDETRDecoder, RTDETRDecoderLayer
from .deform_attn import MSDeformableAttentionV2, deformable_sample
from .denoising import DenoisingGroups, contrastive_denoising_groups

__all__ = [
    'rtdetr_anchors', 'RTDETRDecoder', 'RTDETRDecoderLayer',
    'MSDeformableAttentionV2', 'deformable_sample', 'DenoisingGroups',
    'contrastive_denoising_groups'
]
