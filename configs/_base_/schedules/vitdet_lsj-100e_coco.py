# ViTDet's COCO recipe (Li et al., ECCV 2022, appendix; detectron2
# projects/ViTDet/configs/COCO/mask_rcnn_vitdet_b_100ep.py) on mmdet 3.3's
# large-scale-jitter data (mmdet::common/lsj-100e_coco-instance.py: random
# resize of the 1024 x 1024 frame by 0.1-2.0, crop to 1024 x 1024, flip; the
# data set repeated 4 times x 25 epochs = 100 epochs, 2 images per GPU x 32
# GPUs = 64 per batch), tested at 1024 px on the long side.
# AdamW, lr 1e-4 for batch 64, weight decay 0.1 (not on norms, the absolute
# table, the RoPE-Mixed frequencies or the iRPE tables), layer-wise lr decay
# 0.7 over the backbone's blocks (ViTDet for ViT-B), 250 iterations of linear
# warm-up from 0.001, lr x 0.1 at epochs 88 and 96 (22 and 24 of the 25
# repeated epochs). ViTDet trains with mixed precision: add --amp to
# tools/train.py on GPUs.
# mmpe's runtime (MMPERunner, the data set check, ...) comes with the schedule,
# so every ViTDet config gets it.
_base_ = ['mmdet::common/lsj-100e_coco-instance.py', '../runtime_mmpe.py']

image_size = (1024, 1024)
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(
    _delete_=True,  # the base's SGD
    type='OptimWrapper',
    constructor='ViTLayerDecayOptimWrapperConstructor',
    optimizer=dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    paramwise_cfg=dict(
        layer_decay_rate=0.7,
        norm_decay_mult=0.,
        custom_keys={
            'backbone.pos_embed': dict(decay_mult=0.),
            'backbone.ropes.': dict(decay_mult=0.),
            'attn.rpe_': dict(decay_mult=0.),
        }))

max_epochs = 25  # of the data set repeated 4 times: 100 epochs
train_cfg = dict(max_epochs=max_epochs, val_interval=5)
param_scheduler = [
    dict(
        type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
        end=250),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[22, 24],
        gamma=0.1)
]
auto_scale_lr = dict(enable=False, base_batch_size=64)
