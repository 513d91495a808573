# Quick-start: Mask R-CNN with a tiny CPVT backbone (PEG after block 0, no
# class token, no pretrained weights) on the embedded synthetic instance
# set, evaluated with COCO bbox and segm AP. 4 epochs = 400 iterations of 8
# images; measured 0.8-1 s per iteration on 2 CPU cores (OMP_NUM_THREADS=1),
# so about 6-7 minutes when the cores are free.
#   python tools/dataset_converters/make_synthetic_coco.py
#   python tools/train.py configs/quickstart/mask-rcnn_cpvt-tiny_synthetic.py
#
# Smaller than CPVT-Ti for speed: 128 dims, 4 blocks, 4 heads (16 x 16
# patches, stride 16 as CPVT), and 64 channels in the neck and heads instead
# of 256 (the stride-4 convs dominate the cost on CPU). The simple pyramid
# gives strides 4, 8, 16, 32 (+ 64 by pooling), as the Mask R-CNN heads
# expect. Swap `pos_encoding` ('none', 'learnable', 'sine', 'rope2d',
# 'irpe') to compare position encodings with everything else fixed.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/datasets/synthetic_coco_instance.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)
default_scope = 'mmdet'

num_classes = 4
embed_dims = 128
channels = 64  # neck and heads, instead of 256
model = dict(
    backbone=dict(
        _delete_=True,
        type='CPVT',
        arch=dict(embed_dims=embed_dims, depth=4, num_heads=4, mlp_ratio=4.),
        patch_size=16,
        img_size=256,  # grid of the table if pos_encoding='learnable'
        pos_encoding='peg',
        peg_positions=(0, ),
        use_cls_token=False,
        out_indices=(-1, ),
        init_cfg=None),
    neck=dict(
        _delete_=True,
        type='ViTSimpleFPN',
        in_channels=embed_dims,
        out_channels=channels,
        scale_factors=(4.0, 2.0, 1.0, 0.5),  # strides 4, 8, 16, 32
        num_outs=5,  # + stride 64 by max-pooling, as FPN's P6
        extra_type='maxpool',
        norm_cfg=dict(type='GN', num_groups=32)),
    rpn_head=dict(in_channels=channels, feat_channels=channels),
    roi_head=dict(
        bbox_roi_extractor=dict(
            out_channels=channels,
            roi_layer=dict(sampling_ratio=2)),
        bbox_head=dict(
            in_channels=channels, fc_out_channels=256,
            num_classes=num_classes),
        mask_roi_extractor=dict(
            out_channels=channels,
            roi_layer=dict(sampling_ratio=2)),
        mask_head=dict(
            in_channels=channels,
            conv_out_channels=channels,
            num_classes=num_classes)),
    # at most 4 objects per image: fewer proposals and RoIs than COCO
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1000, max_per_img=300),
        rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(
        rpn=dict(nms_pre=500, max_per_img=100), rcnn=dict(max_per_img=20)))

max_epochs = 4
train_cfg = dict(
    type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=5e-4, weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0., bias_decay_mult=0.),
    clip_grad=dict(max_norm=1., norm_type=2))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=100),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[max_epochs - 1],
        gamma=0.1)
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='CheckpointHook', interval=max_epochs,
                    max_keep_ckpts=1))
auto_scale_lr = dict(enable=False, base_batch_size=8)  # base: 8 images per batch
# A fixed seed (model init, data order, augmentation): repeatable runs.
randomness = dict(seed=0)
