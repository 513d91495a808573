# Quick-start plain DETR on the embedded synthetic data set (the twin of
# detr_irpe_r18_synthetic.py without iRPE). A small DETR trained from scratch
# on 2 CPU cores: the first two stages of a half-width ResNet-18 (stride 8,
# no pretrained weights), 128 dims, 3 + 3 layers, 10 queries. Images are
# resized to fit 128 x 128, so the encoder sees grids of up to 16 x 16 tokens
# (e.g. 16 x 6 for a 3:1 image): large enough for relative positions to
# matter, small enough to train in minutes.
#   python tools/dataset_converters/make_synthetic_coco.py
#   python tools/train.py configs/quickstart/detr_r18_synthetic.py
_base_ = [
    '../_base_/datasets/synthetic_coco_detection.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

embed_dims = 128
num_queries = 10
model = dict(
    type='DETR',
    num_queries=num_queries,
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=8),
    backbone=dict(
        type='ResNet',
        depth=18,
        base_channels=32,
        num_stages=2,
        strides=(1, 2),
        dilations=(1, 1),
        out_indices=(1, ),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        style='pytorch',
        init_cfg=None),
    neck=dict(
        type='ChannelMapper',
        in_channels=[64],
        kernel_size=1,
        out_channels=embed_dims,
        act_cfg=None,
        norm_cfg=None,
        num_outs=1),
    encoder=dict(
        num_layers=3,
        layer_cfg=dict(
            self_attn_cfg=dict(
                embed_dims=embed_dims,
                num_heads=8,
                dropout=0.0,
                batch_first=True),
            ffn_cfg=dict(
                embed_dims=embed_dims,
                feedforward_channels=4 * embed_dims,
                num_fcs=2,
                ffn_drop=0.0,
                act_cfg=dict(type='ReLU', inplace=True)))),
    decoder=dict(
        num_layers=3,
        layer_cfg=dict(
            self_attn_cfg=dict(
                embed_dims=embed_dims,
                num_heads=8,
                dropout=0.0,
                batch_first=True),
            cross_attn_cfg=dict(
                embed_dims=embed_dims,
                num_heads=8,
                dropout=0.0,
                batch_first=True),
            ffn_cfg=dict(
                embed_dims=embed_dims,
                feedforward_channels=4 * embed_dims,
                num_fcs=2,
                ffn_drop=0.0,
                act_cfg=dict(type='ReLU', inplace=True))),
        return_intermediate=True),
    positional_encoding=dict(num_feats=embed_dims // 2, normalize=True),
    bbox_head=dict(
        type='DETRHead',
        num_classes=4,
        embed_dims=embed_dims,
        loss_cls=dict(
            type='CrossEntropyLoss',
            bg_cls_weight=0.1,
            use_sigmoid=False,
            loss_weight=1.0,
            class_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=5.0),
        loss_iou=dict(type='GIoULoss', loss_weight=2.0)),
    train_cfg=dict(
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                dict(type='ClassificationCost', weight=1.),
                dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                dict(type='IoUCost', iou_mode='giou', weight=2.0)
            ])),
    # DETRHead takes top-k over queries: must not exceed num_queries.
    test_cfg=dict(max_per_img=num_queries))

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
    clip_grad=dict(max_norm=0.1, norm_type=2))

# About 10 minutes on 2 CPU cores (100 iterations of 8 images an epoch);
# validation every 4 epochs shows the AP curve rising.
max_epochs = 20
train_cfg = dict(
    type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=4)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[16],
        gamma=0.1)
]

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=25),
    checkpoint=dict(type='CheckpointHook', interval=4, max_keep_ckpts=2))
# RNG states go into checkpoints (RNGStateHook of ../_base_/runtime_mmpe.py),
# so --resume repeats an uninterrupted run.
auto_scale_lr = dict(base_batch_size=16)
# A fixed seed (model init, data order, augmentation), so that `make demo`
# gives the same AP on every run on one machine (README: what the demo reaches).
randomness = dict(seed=0)
