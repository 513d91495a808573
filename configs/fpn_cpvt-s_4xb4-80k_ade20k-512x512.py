# Semantic FPN with CPVT-Small (PEG after block 0) on ADE20K, the PVT /
# Twins protocol: 512 x 512 random crops (ratio 0.5-2.0 of 2048 x 512),
# batch 16 (4 GPUs x 4), AdamW lr 1e-4, weight decay 1e-4, poly decay (power
# 0.9) over 80k iterations; single-scale whole-image test at 2048 x 512,
# mIoU. ViTDet's simple pyramid makes the strides 4-32 that Semantic FPN's
# head expects from the stride-16 ViT map.
#   bash tools/dist_train.sh configs/fpn_cpvt-s_4xb4-80k_ade20k-512x512.py 4
#
# Data: ADE20K (ADEChallengeData2016) at data/ade/ADEChallengeData2016
# (images/{training,validation}, annotations/{training,validation}; 150
# classes, label 0 = "other" ignored: reduce_zero_label=True). Every label
# map is checked (values, size) before the first step (DatasetCheckHook of
# _base_/runtime_mmpe.py).
#
# ImageNet initialisation: convert DeiT-Small weights once with
#   wget https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       deit_small_patch16_224-cd65a155.pth checkpoints/cpvt-s_deit-in1k.pth
# To train from scratch instead: --cfg-options model.backbone.init_cfg=None
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py',
    './_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)
default_scope = 'mmseg'

crop_size = (512, 512)
embed_dims = 384
data_preprocessor = dict(
    size=crop_size,
    # whole-image test: pad to a multiple of 32 so that the stride-32 logits
    # line up with the pixels (the padding is cropped off again)
    test_cfg=dict(size_divisor=32))
model = dict(
    type='PaddingAwareEncoderDecoder',
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone=dict(
        _delete_=True,  # the base's ResNet-50
        type='CPVT',
        arch='small',  # ViT-S/16: 384 dims, 12 blocks, 6 heads
        pos_encoding='peg',
        peg_positions=(0, ),
        use_cls_token=False,
        out_indices=(-1, ),
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained', checkpoint='checkpoints/cpvt-s_deit-in1k.pth')),
    neck=dict(
        _delete_=True,  # the base's FPN over ResNet stages
        type='ViTSimpleFPN',
        in_channels=embed_dims,
        out_channels=256,
        scale_factors=(4.0, 2.0, 1.0, 0.5)),  # strides 4, 8, 16, 32
    decode_head=dict(num_classes=150))

train_dataloader = dict(batch_size=4)  # x 4 GPUs
# no weight decay on norms, biases and position tables
optim_wrapper = dict(
    _delete_=True,  # the base schedule's SGD
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                   weight_decay=1e-4),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        bias_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.)
        }),
    clip_grad=None)
param_scheduler = [
    dict(
        type='PolyLR', power=0.9, eta_min=0., by_epoch=False, begin=0,
        end=80000)
]
auto_scale_lr = dict(enable=False, base_batch_size=16)
