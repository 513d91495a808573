# RT-DETRv2-S: RT-DETRv2 with ResNet-18-vd, 120 epochs on COCO 2017
# (lyuwenyu/RT-DETR, rtdetrv2_pytorch/configs/rtdetrv2/
# rtdetrv2_r18vd_120e_coco.yml).
# Target: the released 48.1 box AP (AP50 65.1) on val2017 at 640 x 640
# (rtdetrv2_pytorch/README.md; checkpoint
# rtdetrv2_r18vd_120e_coco_rerun_48.1.pth).
# As the R50vd 6x recipe (rtdetrv2_r50vd_6x_coco.py: the base files and
# their differences from the authors' code) but for what the YAML changes:
#   - backbone ResNet-18-vd, nothing frozen (freeze_at -1), BatchNorm
#     trained (freeze_norm False); levels of 128, 256, 512 channels;
#   - HybridEncoder expansion 0.5; 3 decoder layers;
#   - parameter groups: the YAML replaces the list with one group, no
#     weight decay on every norm (backbone included), and no backbone lr:
#     the backbone trains at lr 1e-4 like the rest;
#   - no batch-level multi-scale: the YAML sets the collate function's
#     `scales: ~` (every batch at 640 x 640), so the model has no
#     RTDETRBatchResize and no hook stops one;
#   - 120 epochs, augmentations stopped from epoch 117.
# Backbone weights:
#   wget https://github.com/lyuwenyu/storage/releases/download/v0.1/ResNet18_vd_pretrained_from_paddle.pth
#   python tools/model_converters/rtdetrv2_to_mmpe.py --backbone \
#       ResNet18_vd_pretrained_from_paddle.pth \
#       checkpoints/resnet18vd_rtdetr_mmpe.pth
#   bash tools/dist_train.sh configs/rtdetr/rtdetrv2_r18vd_120e_coco.py 4
_base_ = [
    '../_base_/models/rtdetrv2_r50vd.py',
    '../_base_/schedules/rtdetrv2_coco.py',
]

model = dict(
    data_preprocessor=dict(batch_augments=None),
    backbone=dict(
        depth=18,
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        init_cfg=dict(checkpoint='checkpoints/resnet18vd_rtdetr_mmpe.pth')),
    neck=dict(in_channels=[128, 256, 512], expansion=0.5),
    bbox_head=dict(num_layers=3))

optim_wrapper = dict(
    constructor='DefaultOptimWrapperConstructor',
    paramwise_cfg=dict(_delete_=True, norm_decay_mult=0.))

max_epochs = 120
stop_epoch = 117
train_cfg = dict(max_epochs=max_epochs)
custom_hooks = [
    # the runtime base's hooks (configs/_base_/runtime_mmpe.py), named again
    # because this list replaces the base's
    dict(type='DatasetCheckHook'),
    dict(type='PlainParamGroupsHook'),
    dict(type='RNGStateHook'),
    dict(type='PreemptionHook'),
    dict(type='PlainCheckpointHook'),
    {{_base_.ema_hook}},
    dict(
        type='PipelineSwitchHook',
        switch_epoch=stop_epoch,
        switch_pipeline={{_base_.train_pipeline_stage2}}),
]
