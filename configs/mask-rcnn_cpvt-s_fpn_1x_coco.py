# Mask R-CNN with a CPVT-Small backbone (PEG after block 0, GAP, no class
# token) and a ViTDet simple feature pyramid (strides 4-64), COCO 1x
# schedule; evaluated with COCO bbox and segm AP.
#
# ImageNet initialisation: convert DeiT-Small weights once with
#   wget https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       deit_small_patch16_224-cd65a155.pth checkpoints/cpvt-s_deit-in1k.pth
# (or set `pretrained = None` below to train from scratch).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py'
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)
default_scope = 'mmdet'

pretrained = 'checkpoints/cpvt-s_deit-in1k.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='CPVT',
        arch='small',
        pos_encoding='peg',  # 'none' | 'learnable' | 'sine' | 'rope2d' | 'irpe'
        peg_positions=(0, ),
        use_cls_token=False,
        out_indices=(-1, ),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)
        if pretrained else None),
    neck=dict(
        _delete_=True,
        type='ViTSimpleFPN',
        in_channels=384,
        out_channels=256,
        scale_factors=(4.0, 2.0, 1.0, 0.5),  # strides 4, 8, 16, 32
        num_outs=5,  # + stride 64 by max-pooling, as FPN's P6
        extra_type='maxpool'))

# ViT backbones train with AdamW (no decay on norms and position tables)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        bias_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.)
        }),
    clip_grad=dict(max_norm=1., norm_type=2))
auto_scale_lr = dict(enable=False, base_batch_size=16)
