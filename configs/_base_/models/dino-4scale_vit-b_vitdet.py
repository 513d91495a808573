# DINO (Zhang et al., ICLR 2023) on mmpe's plain ViT in ViTDet's layout, as
# detrex's DINO-ViTDet pairs them: mmdet 3.3's 4-scale DINO
# (mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py: 900 queries, denoising
# groups, 6 + 6 deformable layers over 4 levels, its multi-scale DETR data up
# to 1333 x 800 and its 12-epoch schedule, batch 16) with the ResNet-50 and
# its channel mapper replaced by
#   - a ViT-B/16 (CPVT, no class token) attending in 14 x 14 windows except in
#     blocks 2, 5, 8, 11 (global), drop path 0.1, as ViTDet's backbone;
#   - ViTDet's simple feature pyramid from the stride-16 map giving DINO's four
#     levels: strides 8 (deconv), 16 (identity), 32 (max-pool) and 64 (1x1
#     max-pool of the stride-32 level, ViTDet's LastLevelMaxPool), 256
#     channels each, LayerNorm in its convs;
#   - ViTDet's optimiser: AdamW, lr 1e-4, weight decay 0.1 (not on norms, the
#     absolute table, the RoPE-Mixed frequencies or the iRPE tables), the
#     backbone's lr decayed layer-wise by 0.7 (instead of DINO's x 0.1 on the
#     whole backbone), with DINO's gradient clipping (max norm 0.1).
# The encoder, the decoder and the DINO head are mmdet's, unchanged. The
# detector passes each batch's padding to the backbone (PaddingAwareDINO:
# padded tokens are masked keys, as the windows' own padding) and refuses a
# pyramid whose number of levels is not the deformable attention's
# num_levels. The position encoding and the ImageNet weights are set by each
# config (configs/dino-4scale_vit-*_vitdet_12e_coco.py).
_base_ = [
    'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py', '../runtime_mmpe.py'
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

embed_dims = 768
model = dict(
    type='PaddingAwareDINO',
    backbone=dict(
        _delete_=True,  # the base's ResNet-50
        type='CPVT',
        arch='base',  # ViT-B/16: 768 dims, 12 blocks, 12 heads
        patch_size=16,
        img_size=224,  # pre-training size (grid of a 'learnable' table)
        use_cls_token=False,  # ViTDet has none; windows refuse one
        window_size=14,
        global_blocks=(2, 5, 8, 11),
        drop_path_rate=0.1,
        out_indices=(-1, )),
    neck=dict(
        _delete_=True,  # the base's ChannelMapper of ResNet stages 2-4
        type='ViTSimpleFPN',
        in_channels=embed_dims,
        out_channels=256,  # DINO's embed_dims
        scale_factors=(2.0, 1.0, 0.5),  # strides 8, 16, 32
        num_outs=4,  # + stride 64: DINO's 4 levels (encoder num_levels=4)
        extra_type='maxpool',
        norm_cfg=dict(type='LayerNorm2d')))

optim_wrapper = dict(
    _delete_=True,  # the base's AdamW with the backbone at lr x 0.1
    type='OptimWrapper',
    constructor='ViTLayerDecayOptimWrapperConstructor',
    optimizer=dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    clip_grad=dict(max_norm=0.1, norm_type=2),
    paramwise_cfg=dict(
        layer_decay_rate=0.7,
        norm_decay_mult=0.,
        custom_keys={
            'backbone.pos_embed': dict(decay_mult=0.),
            'backbone.ropes.': dict(decay_mult=0.),
            'attn.rpe_': dict(decay_mult=0.),
        }))
