# The RT-DETRv2 training recipe and its data (lyuwenyu/RT-DETR,
# rtdetrv2_pytorch/configs/rtdetrv2/include/optimizer.yml, dataloader.yml
# and configs/runtime.yml) as its R50vd 6x file leaves it; the recipes in
# configs/rtdetr/ change what their YAML changes:
#   - AdamW, lr 1e-4, betas (0.9, 0.999), weight decay 1e-4; the backbone
#     (but its norms) at lr 1e-5; weight decay 0 on the norms of the encoder
#     and decoder (the YAML's regexes on the authors' names: every norm layer
#     of their model is named `norm*` or `*bn*` and every such name is a
#     norm, so MMEngine's norm_decay_mult=0 is the same rule; the backbone's
#     norms are frozen);
#   - gradients clipped at max norm 0.1; AMP (use_amp: float16 with dynamic
#     loss scaling: AmpOptimWrapper unscales before clipping, as their
#     GradScaler loop);
#   - lr: linear warm-up over the first 2000 iterations, factor
#     min(1, (i + 1) / 2000) at iteration i (their LinearWarmup; MMEngine's
#     LinearLR from 1/2000 over `end=2000` steps is that factor exactly),
#     then constant (their MultiStepLR milestone 1000 is past every recipe's
#     last epoch);
#   - EMA of the weights and buffers, decay 0.9999 * (1 - exp(-t / 2000))
#     after step t (their ModelEMA: mmpe's RTDETREMA through MMEngine's
#     EMAHook); validation and checkpoints' state_dict hold the EMA weights
#     (their evaluation and release use the EMA);
#   - 72 epochs; photometric / zoom-out / IoU-crop and the batch-level
#     multi-scale stopped from epoch 71 (0-based: the last epoch);
#   - SyncBN across GPUs (sync_bn: True); validation every epoch; a
#     checkpoint every epoch.
# Differences: the EMA copies the model when the run starts (MMEngine's
# EMAHook, before the pre-trained backbone is loaded) where the authors copy
# it after; the first update weighs that copy by d_1 = 0.9999 * (1 -
# exp(-1 / 2000)) < 5e-4 and every later update shrinks it further, so
# from the first step on the average is the authors' to within 5e-4 of
# that difference. The authors compute the losses outside autocast;
# AmpOptimWrapper's context covers the whole loss call, and the head casts
# the decoder's outputs to float32 for the matching and the losses (their
# ops, elementwise, autocast leaves in float32): the same losses.
_base_ = [
    '../datasets/rtdetr_coco_detection.py', 'mmdet::_base_/default_runtime.py',
    '../runtime_mmpe.py'
]

max_epochs = 72
stop_epoch = 71
optim_wrapper = dict(
    type='AmpOptimWrapper',
    loss_scale='dynamic',
    constructor='LrFactorOptimWrapperConstructor',
    optimizer=dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4),
    clip_grad=dict(max_norm=0.1, norm_type=2),
    paramwise_cfg=dict(norm_decay_mult=0., lr_factors=dict(backbone=0.1)))
warmup_iters = 2000
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1. / warmup_iters,
        end_factor=1.0,
        by_epoch=False,
        begin=0,
        end=warmup_iters)
]
train_cfg = dict(
    type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
ema_hook = dict(
    type='EMAHook',
    ema_type='RTDETREMA',
    decay=0.9999,
    warmups=2000,
    priority=49)
custom_hooks = [
    # the runtime base's hooks (configs/_base_/runtime_mmpe.py), named again
    # because this list replaces the base's
    dict(type='DatasetCheckHook'),
    dict(type='PlainParamGroupsHook'),
    dict(type='RNGStateHook'),
    dict(type='PreemptionHook'),
    dict(type='PlainCheckpointHook'),
    ema_hook,
    dict(
        type='PipelineSwitchHook',
        switch_epoch=stop_epoch,
        switch_pipeline={{_base_.train_pipeline_stage2}}),
    dict(type='BatchResizeStopHook', stop_epoch=stop_epoch),
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=100),
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3))
sync_bn = 'torch'
# the authors' batch: 16 images (4 GPUs x 4)
auto_scale_lr = dict(enable=False, base_batch_size=16)
