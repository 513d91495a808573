# RT-DETRv2-M*: RT-DETRv2 with ResNet-34-vd, 120 epochs on COCO 2017
# (lyuwenyu/RT-DETR, rtdetrv2_pytorch/configs/rtdetrv2/
# rtdetrv2_r34vd_120e_coco.yml).
# Target: the released 49.9 box AP (AP50 67.5) on val2017 at 640 x 640
# (rtdetrv2_pytorch/README.md; checkpoint rtdetrv2_r34vd_120e_coco_ema.pth).
# As the R50vd 6x recipe (rtdetrv2_r50vd_6x_coco.py: the base files and
# their differences from the authors' code) but for what the YAML changes:
#   - backbone ResNet-34-vd, nothing frozen (freeze_at -1), BatchNorm
#     trained (freeze_norm False); levels of 128, 256, 512 channels;
#   - HybridEncoder expansion 0.5; 4 decoder layers;
#   - parameter groups (the YAML's three): the backbone at lr 5e-5 (x 0.5),
#     its norms without weight decay; in the encoder and decoder no weight
#     decay on norms and on every bias (the regex `norm|bn|bias`: also
#     nn.MultiheadAttention's `in_proj_bias`, hence the custom key; the
#     backbone's convs have no bias);
#   - 120 epochs, augmentations and multi-scale stopped from epoch 117.
# Backbone weights:
#   wget https://github.com/lyuwenyu/storage/releases/download/v0.1/ResNet34_vd_pretrained_from_paddle.pth
#   python tools/model_converters/rtdetrv2_to_mmpe.py --backbone \
#       ResNet34_vd_pretrained_from_paddle.pth \
#       checkpoints/resnet34vd_rtdetr_mmpe.pth
#   bash tools/dist_train.sh configs/rtdetr/rtdetrv2_r34vd_120e_coco.py 4
_base_ = [
    '../_base_/models/rtdetrv2_r50vd.py',
    '../_base_/schedules/rtdetrv2_coco.py',
]

model = dict(
    backbone=dict(
        depth=34,
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        init_cfg=dict(checkpoint='checkpoints/resnet34vd_rtdetr_mmpe.pth')),
    neck=dict(in_channels=[128, 256, 512], expansion=0.5),
    bbox_head=dict(num_layers=4))

optim_wrapper = dict(
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        bias_decay_mult=0.,
        custom_keys={'in_proj_bias': dict(decay_mult=0.)},
        lr_factors=dict(backbone=0.5)))

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
    dict(type='BatchResizeStopHook', stop_epoch=stop_epoch),
]
