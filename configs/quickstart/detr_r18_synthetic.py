# Quick-start plain DETR on the embedded synthetic data set (the twin of
# detr_irpe_r18_synthetic.py without iRPE). A small DETR trained from scratch
# on 2 CPU cores: ResNet-18's first three stages (stride 16, no pretrained
# weights), 128 dims, 3 + 3 layers, 10 queries.
#   python tools/dataset_converters/make_synthetic_coco.py
#   python tools/train.py configs/quickstart/detr_r18_synthetic.py
_base_ = [
    '../_base_/datasets/synthetic_coco_detection.py',
    'mmdet::_base_/default_runtime.py'
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
        pad_size_divisor=16),
    backbone=dict(
        type='ResNet',
        depth=18,
        num_stages=3,
        strides=(1, 2, 2),
        dilations=(1, 1, 1),
        out_indices=(2, ),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        style='pytorch',
        init_cfg=None),
    neck=dict(
        type='ChannelMapper',
        in_channels=[256],
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

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-4, weight_decay=1e-4),
    clip_grad=dict(max_norm=0.1, norm_type=2))

max_epochs = 24
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
        milestones=[20],
        gamma=0.1)
]

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(type='CheckpointHook', interval=4, max_keep_ckpts=2))
auto_scale_lr = dict(base_batch_size=16)
