# Quick-start twin of the DINO-ViTDet configs (configs/dino-4scale_vit-*_
# vitdet_*): mmdet's 4-scale DINO (denoising queries, two-stage, box
# refinement, 4-level deformable encoder / decoder, DINOHead: the types and
# losses of mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py, shrunk) on a tiny
# plain ViT in ViTDet's layout whose position information is iRPE, on the
# embedded synthetic data set, evaluated with COCO bbox AP. No pretrained
# weights; 4 epochs (400 iterations of 8 images): 11.3 minutes on one
# thread beside other jobs, bbox AP 0.292 / AP50 0.489 (seed 0;
# docs/data/dino_vitdet.json).
#   python tools/dataset_converters/make_synthetic_coco.py
#   python tools/train.py configs/quickstart/dino_vit-tiny-irpe_vitdet_synthetic.py
#
# Backbone: 128 dims, 4 blocks, 4 heads, 16 x 16 patches; contextual product
# iRPE on keys in every block (tables from zero, as the COCO config);
# attention inside 4 x 4 windows (the images, resized to fit 128 x 128, are
# up to 8 patches a side) in blocks 0 and 2, global in 1 and 3 (ViTDet: 2,
# 5, 8, 11 of 12).
# No final norm (detectron2's ViT, as the COCO configs).
# Pyramid and channel mapper: the COCO configs' (strides 8, 16, 32, 64, 256
# channels, then a 1x1 conv + GroupNorm(32) per level).
# Transformer: 256 dims, 2 encoder + 3 decoder layers (6 + 6 on COCO), 30
# queries and 20 denoising queries (900 and 100: at most 4 objects an image
# here). Optimiser: detrex's DINO-ViTDet rule (AdamW, weight decay 1e-4 with
# norms at 0, clipping at 0.1) but for the backbone's lr: the tiny ViT
# trains from scratch, so it and the pyramid get the full lr (detrex's
# x 0.1 is for a pre-trained backbone), 2e-4 as the quick-start DETRs.
# Swap `pos_encoding` ('none', 'peg', 'rope-mixed', ...) to compare
# encodings with everything else fixed.
_base_ = [
    '../_base_/datasets/synthetic_coco_detection.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/runtime_mmpe.py',
    '../_base_/irpe_tables/imagenet.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

num_classes = 4
vit_dims = 128
# DINO's transformer: 256 dims as on COCO (mmdet 3.3's DINO decoder encodes
# its reference points with 128 sine features per coordinate, so it needs
# 256); 1024 FFN channels (2048 on COCO)
embed_dims = 256
num_levels = 4
num_queries = 30
model = dict(
    type='PaddingAwareDINO',
    num_queries=num_queries,
    with_box_refine=True,
    as_two_stage=True,
    num_feature_levels=num_levels,
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=1),
    backbone=dict(
        type='CPVT',
        arch=dict(embed_dims=vit_dims, depth=4, num_heads=4, mlp_ratio=4.),
        patch_size=16,
        img_size=256,
        pos_encoding='irpe',
        rpe_cfg=dict(
            mode='contextual',
            method='product',
            ratio=1.9,
            shared_head=True,
            rpe_on='k',
            init={{_base_.rpe_table_init}}),
        use_cls_token=False,
        window_size=4,
        global_blocks=(1, 3),
        drop_path_rate=0.1,
        final_norm=False,
        out_indices=(-1, ),
        init_cfg=None),
    neck=dict(
        type='ViTSimpleFPN',
        in_channels=vit_dims,
        out_channels=embed_dims,
        scale_factors=(2.0, 1.0, 0.5),  # strides 8, 16, 32
        num_outs=num_levels,  # + stride 64 by max-pooling
        extra_type='maxpool',
        norm_cfg=dict(type='LayerNorm2d'),
        out_norm_cfg=dict(type='GN', num_groups=32)),
    encoder=dict(
        num_layers=2,
        layer_cfg=dict(
            self_attn_cfg=dict(
                embed_dims=embed_dims, num_levels=num_levels, dropout=0.0),
            ffn_cfg=dict(
                embed_dims=embed_dims,
                feedforward_channels=1024,
                ffn_drop=0.0))),
    decoder=dict(
        num_layers=3,
        return_intermediate=True,
        layer_cfg=dict(
            self_attn_cfg=dict(
                embed_dims=embed_dims, num_heads=8, dropout=0.0),
            cross_attn_cfg=dict(
                embed_dims=embed_dims, num_levels=num_levels, dropout=0.0),
            ffn_cfg=dict(
                embed_dims=embed_dims,
                feedforward_channels=1024,
                ffn_drop=0.0)),
        post_norm_cfg=None),
    positional_encoding=dict(
        num_feats=embed_dims // 2,
        normalize=True,
        offset=0.0,
        temperature=20),
    bbox_head=dict(
        type='DINOHead',
        num_classes=num_classes,
        embed_dims=embed_dims,
        sync_cls_avg_factor=True,
        loss_cls=dict(
            type='FocalLoss',
            use_sigmoid=True,
            gamma=2.0,
            alpha=0.25,
            loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=5.0),
        loss_iou=dict(type='GIoULoss', loss_weight=2.0)),
    dn_cfg=dict(
        label_noise_scale=0.5,
        box_noise_scale=1.0,
        group_cfg=dict(dynamic=True, num_groups=None, num_dn_queries=20)),
    train_cfg=dict(
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                dict(type='FocalLossCost', weight=2.0),
                dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                dict(type='IoUCost', iou_mode='giou', weight=2.0)
            ])),
    test_cfg=dict(max_per_img=num_queries))

# Images resized to fit 128 x 128, as the quick-start DETRs: grids of up to
# 8 x 8 tokens in the backbone (2 x 2 windows) and 16 x 16 at stride 8, so
# that the 4-level encoder trains in minutes on a CPU.
img_scale = (128, 128)
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-4, weight_decay=1e-4),
    paramwise_cfg=dict(norm_decay_mult=0.),
    clip_grad=dict(max_norm=0.1, norm_type=2))

# 4 epochs = 400 iterations of 8 images, lr x 0.1 for the last (as DINO's
# 12-epoch schedule drops it for its last epoch)
max_epochs = 4
train_cfg = dict(
    type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[max_epochs - 1],
        gamma=0.1)
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=25),
    checkpoint=dict(type='CheckpointHook', interval=max_epochs,
                    max_keep_ckpts=1))
auto_scale_lr = dict(enable=False, base_batch_size=8)
# A fixed seed (model init, data order, augmentation): repeatable runs.
randomness = dict(seed=0)
