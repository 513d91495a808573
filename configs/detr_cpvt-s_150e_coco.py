# DETR with a CPVT-Small backbone (PEG after block 0, GAP, no class token),
# mmdet's DETR 150-epoch recipe. The stride-16 map is max-pooled to stride
# 32 (as ResNet's C5) and projected to 256 channels for the transformer.
#
# ImageNet initialisation: convert DeiT-Small weights once with
#   wget https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       deit_small_patch16_224-cd65a155.pth checkpoints/cpvt-s_deit-in1k.pth
# (or set `pretrained = None` below to train from scratch).
_base_ = 'mmdet::detr/detr_r50_8xb2-150e_coco.py'
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
        scale_factors=(0.5, ),  # one stride-32 level, as DETR's C5
        num_outs=1))
# The base recipe keeps AdamW(lr 1e-4, wd 1e-4), backbone lr x 0.1 and
# grad-norm clipping at 0.1.
