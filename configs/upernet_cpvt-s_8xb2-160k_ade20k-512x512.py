# UperNet with CPVT-Small (PEG after block 0) on ADE20K, the Swin protocol:
# 512 x 512 random crops, batch 16 (8 GPUs x 2), AdamW lr 6e-5, betas (0.9,
# 0.999), weight decay 0.01, linear warm-up over 1500 iterations then poly
# decay (power 1) to 160k, auxiliary FCN head (weight 0.4); single-scale
# whole-image test at 2048 x 512, mIoU. The multi-scale input of UperNet is
# mmseg's MultiLevelNeck over blocks 4, 6, 8 and 12 (mmseg's ViT UperNet,
# _base_/models/upernet_vit-b16_ln_mln.py).
#   bash tools/dist_train.sh configs/upernet_cpvt-s_8xb2-160k_ade20k-512x512.py 8
#
# Data (data/ade/ADEChallengeData2016) and the ImageNet initialisation
# (checkpoints/cpvt-s_deit-in1k.pth): as
# configs/fpn_cpvt-s_4xb4-80k_ade20k-512x512.py.
_base_ = [
    'mmseg::_base_/models/upernet_vit-b16_ln_mln.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
    './_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)
default_scope = 'mmseg'

crop_size = (512, 512)
embed_dims = 384
data_preprocessor = dict(size=crop_size, test_cfg=dict(size_divisor=32))
model = dict(
    type='PaddingAwareEncoderDecoder',
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone=dict(
        _delete_=True,  # the base's ViT-B
        type='CPVT',
        arch='small',
        pos_encoding='peg',
        peg_positions=(0, ),
        use_cls_token=False,
        out_indices=(3, 5, 7, 11),
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained', checkpoint='checkpoints/cpvt-s_deit-in1k.pth')),
    neck=dict(
        in_channels=[embed_dims] * 4,
        out_channels=embed_dims,
        scales=[4, 2, 1, 0.5]),
    decode_head=dict(in_channels=[embed_dims] * 4, num_classes=150),
    auxiliary_head=dict(in_channels=embed_dims, num_classes=150),
    test_cfg=dict(mode='whole'))

train_dataloader = dict(batch_size=2)  # x 8 GPUs
optim_wrapper = dict(
    _delete_=True,  # the base schedule's SGD
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999),
                   weight_decay=0.01),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        bias_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.)
        }))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0,
         end=1500),
    dict(type='PolyLR', power=1.0, eta_min=0., by_epoch=False, begin=1500,
         end=160000)
]
auto_scale_lr = dict(enable=False, base_batch_size=16)
