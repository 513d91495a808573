# Quick-start RT-DETRv2 on the embedded synthetic data set: the COCO
# recipe's parts (configs/rtdetr/rtdetrv2_r18vd_120e_coco.py and its base
# files) shrunk to train from scratch on a CPU (400 iterations of 8 images
# of 128 x 128).
#   python tools/dataset_converters/make_synthetic_coco.py
#   python tools/train.py configs/quickstart/rtdetr_r18vd_synthetic.py
#
# As the COCO recipes: ResNet-vd (PResNetVd: deep stem, average-pool
# shortcut) levels at strides 8, 16, 32 into the hybrid encoder (AIFI with
# the 2D sin-cos on the stride-32 map, CCFM with CSPRep blocks), the
# RT-DETRv2 decoder (deformable cross-attention with 4 points per level,
# IoU-aware query selection, denoising queries), VFL + L1 + GIoU; the
# authors' training augmentations (photometric, zoom-out, IoU crop, flip,
# square resize) and batch-level multi-scale, both stopped for the last
# epochs; RT-DETR's EMA; AdamW, norms without weight decay, clipping at 0.1.
# Shrunk: a ResNet-18-vd of quarter width (16 stem channels, levels of 32,
# 64, 128), 64 channels in encoder and decoder, 4 heads, 3 decoder layers,
# 30 queries and 20 denoising queries (at most 4 objects an image here);
# images 128 x 128 (multi-scale 96-160, 128 three times of five, as 640
# among the recipes' 13 sizes), as the other quick-start configs; 4 epochs
# of 100 iterations of 8 images, the augmentations and the multi-scale
# stopped for the last (from epoch 3, 0-based; the recipes' last 1-3 of
# 72-120);
# lr 2e-4 (as the other quick-start configs; from scratch, no backbone
# factor) warmed up over 100 iterations (2000 on COCO); no AMP (CPU).
# Swap `model.neck.encoder_pe.relative` (None here: the authors' AIFI) for
# 'irpe', 'rope-mixed', 'log-cpb', 'lookhere', ... to compare encodings with
# everything else fixed.
_base_ = [
    '../_base_/datasets/synthetic_coco_detection.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

num_classes = 4
hidden_dim = 64
num_queries = 30
img_scale = (128, 128)
model = dict(
    type='RTDETR',
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[0, 0, 0],
        std=[255, 255, 255],
        bgr_to_rgb=True,
        pad_size_divisor=32,
        batch_augments=[
            dict(
                type='RTDETRBatchResize',
                scales=[96, 128, 128, 128, 160])
        ]),
    backbone=dict(
        type='PResNetVd',
        depth=18,
        base_channels=16,
        stem_channels=16,
        num_stages=4,
        out_indices=(1, 2, 3),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        style='pytorch',
        init_cfg=None),
    neck=dict(
        type='RTDETRHybridEncoder',
        in_channels=[32, 64, 128],
        feat_strides=[8, 16, 32],
        hidden_dim=hidden_dim,
        use_encoder_idx=[2],
        num_encoder_layers=1,
        num_heads=4,
        dim_feedforward=4 * hidden_dim,
        dropout=0.0,
        enc_act='gelu',
        expansion=0.5,
        depth_mult=1.0,
        act='silu',
        encoder_pe=dict(absolute='sine', relative=None)),
    bbox_head=dict(
        type='RTDETRHead',
        num_classes=num_classes,
        embed_dims=hidden_dim,
        in_channels=[hidden_dim] * 3,
        num_levels=3,
        num_queries=num_queries,
        num_layers=3,
        num_heads=4,
        ffn_dims=4 * hidden_dim,
        num_points=[4, 4, 4],
        cross_attn_method='default',
        query_select_method='default',
        num_denoising=20,
        label_noise_ratio=0.5,
        box_noise_scale=1.0,
        eval_idx=-1,
        loss_weights=dict(loss_vfl=1.0, loss_bbox=5.0, loss_giou=2.0),
        vfl_alpha=0.75,
        vfl_gamma=2.0),
    train_cfg=dict(
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                # eps: the released matcher's (mmdet's default 1e-12)
                dict(type='FocalLossCost', weight=2.0, alpha=0.25,
                     gamma=2.0, eps=1e-8),
                dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                dict(type='IoUCost', iou_mode='giou', weight=2.0)
            ])),
    test_cfg=dict(max_per_img=num_queries))

# The COCO recipes' pipelines (_base_/datasets/rtdetr_coco_detection.py) at
# 128 x 128.
load_image = dict(
    type='LoadImageFromFile',
    imdecode_backend='pillow',
    color_type='color_ignore_orientation',
    backend_args={{_base_.backend_args}})
resize = dict(
    type='Resize',
    scale=img_scale,
    keep_ratio=False,
    backend='pillow',
    interpolation='bilinear')
sanitize = dict(
    type='FilterAnnotations', min_gt_bbox_wh=(1, 1), keep_empty=False)
train_pipeline = [
    load_image,
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomPhotometricDistort', p=0.5),
    dict(type='Expand', mean=[0, 0, 0], to_rgb=False, ratio_range=(1, 4),
         prob=0.5),
    dict(type='RandomIoUCrop', p=0.8),
    sanitize,
    dict(type='RandomFlip', prob=0.5),
    resize,
    sanitize,
    dict(type='PackDetInputs')
]
train_pipeline_stage2 = [
    load_image,
    dict(type='LoadAnnotations', with_bbox=True),
    sanitize,
    dict(type='RandomFlip', prob=0.5),
    resize,
    sanitize,
    dict(type='PackDetInputs')
]
test_pipeline = [
    load_image,
    resize,
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
train_dataloader = dict(
    batch_size=8,
    drop_last=True,
    batch_sampler=None,
    dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=2e-4, betas=(0.9, 0.999), weight_decay=1e-4),
    clip_grad=dict(max_norm=0.1, norm_type=2),
    paramwise_cfg=dict(norm_decay_mult=0.))

max_epochs = 4
stop_epoch = 3
train_cfg = dict(
    type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1. / 100,
        end_factor=1.0,
        by_epoch=False,
        begin=0,
        end=100)
]
custom_hooks = [
    dict(
        type='EMAHook',
        ema_type='RTDETREMA',
        decay=0.9999,
        warmups=2000,
        priority=49),
    dict(
        type='PipelineSwitchHook',
        switch_epoch=stop_epoch,
        switch_pipeline=train_pipeline_stage2),
    dict(type='BatchResizeStopHook', stop_epoch=stop_epoch),
    # the runtime base's hooks (configs/_base_/runtime_mmpe.py), named again
    # after the RT-DETR hooks (their indices are used by --cfg-options),
    # because this list replaces the base's
    dict(type='DatasetCheckHook'),
    dict(type='PlainParamGroupsHook'),
    dict(type='RNGStateHook'),
    dict(type='PreemptionHook'),
    dict(type='PlainCheckpointHook'),
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=25),
    checkpoint=dict(type='CheckpointHook', interval=max_epochs,
                    max_keep_ckpts=1))
auto_scale_lr = dict(enable=False, base_batch_size=8)
# A fixed seed (model init, data order, augmentation): repeatable runs.
randomness = dict(seed=0)
