# Quick-start semantic segmentation (MMSegmentation): Semantic FPN with a
# tiny CPVT backbone (PEG after block 0, no class token, no pretrained
# weights) on the embedded synthetic shapes (5 classes, background
# included), evaluated with mmseg's IoUMetric (mIoU). `make demo-seg` runs
#   python tools/dataset_converters/make_synthetic_seg.py
#   python tools/train.py configs/quickstart/fpn_cpvt-tiny_synthetic-seg.py
#   python tools/test.py configs/quickstart/fpn_cpvt-tiny_synthetic-seg.py \
#       work_dirs/demo-seg/iter_1500.pth
# (README "Semantic segmentation" has its time and mIoU).
#
# The backbone is the tiny CPVT of the quick-start Mask R-CNN (128 dims, 4
# blocks, 4 heads, 16 x 16 patches); ViTDet's simple pyramid turns its
# stride-16 map into strides 4, 8, 16, 32 for mmseg's FPNHead (64 channels
# instead of 256 / 128). PaddingAwareEncoderDecoder tells the backbone where
# each training batch is padded (crops of thin images are smaller than the
# crop size). Swap `pos_encoding` ('none', 'learnable', 'sine', 'rope2d',
# 'rope-mixed', 'irpe') to compare position encodings with everything else
# fixed (tools/experiments/ablation.py --studies cpvt_seg).
_base_ = [
    '../_base_/datasets/synthetic_seg.py',
    'mmseg::_base_/default_runtime.py',
    '../_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)
default_scope = 'mmseg'

num_classes = 5
embed_dims = 128
channels = 64
crop_size = (128, 128)
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    size=crop_size,
    # test images padded to a multiple of 32 (the coarsest level), so the
    # logits line up with the pixels; the padding is cropped off again
    test_cfg=dict(size_divisor=32))
model = dict(
    type='PaddingAwareEncoderDecoder',
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='CPVT',
        arch=dict(embed_dims=embed_dims, depth=4, num_heads=4, mlp_ratio=4.),
        patch_size=16,
        img_size=crop_size[0],  # grid of the table if pos_encoding='learnable'
        pos_encoding='peg',
        peg_positions=(0, ),
        use_cls_token=False,
        out_indices=(-1, ),
        init_cfg=None),
    neck=dict(
        type='ViTSimpleFPN',
        in_channels=embed_dims,
        out_channels=channels,
        scale_factors=(4.0, 2.0, 1.0, 0.5)),  # strides 4, 8, 16, 32
    decode_head=dict(
        type='FPNHead',
        in_channels=[channels] * 4,
        in_index=[0, 1, 2, 3],
        feature_strides=[4, 8, 16, 32],
        channels=channels,
        dropout_ratio=0.1,
        num_classes=num_classes,
        norm_cfg=dict(type='BN', requires_grad=True),
        align_corners=False,
        # mean over the labelled pixels (crops' padding is ignored, 255)
        loss_decode=dict(
            type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0,
            avg_non_ignore=True)),
    train_cfg=dict(),
    # 'whole' here; the resolution study also tests mode='slide' with
    # crop_size=(128, 128), stride=(85, 85)
    test_cfg=dict(mode='whole'))

max_iters = 1500
train_cfg = dict(
    type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999),
                   weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        bias_decay_mult=0.,
        custom_keys={'pos_embed': dict(decay_mult=0.)}),
    clip_grad=dict(max_norm=1., norm_type=2))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=100),
    dict(type='PolyLR', power=1.0, eta_min=0., by_epoch=False, begin=100,
         end=max_iters)
]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(
        type='CheckpointHook', by_epoch=False, interval=max_iters,
        max_keep_ckpts=1),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
# label values and sizes of every file are checked before the first step
# (DatasetCheckHook of ../_base_/runtime_mmpe.py)
log_processor = dict(by_epoch=False)
auto_scale_lr = dict(enable=False, base_batch_size=8)
