# configs/dino-4scale_vit-b-irpe_vitdet_12e_coco.py with a ViT-S/16 (384
# dims, 12 blocks, 6 heads): same windows (14 x 14; global blocks 2, 5, 8,
# 11), pyramid (strides 8, 16, 32, 64 at 256 channels), DINO head, data and
# recipe (layer-wise lr decay 0.7, drop path 0.1).
#
# ImageNet initialisation: DeiT-Small (the iRPE tables start at zero):
#   wget https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       deit_small_patch16_224-cd65a155.pth checkpoints/cpvt-s_deit-in1k.pth
_base_ = './dino-4scale_vit-b-irpe_vitdet_12e_coco.py'

embed_dims = 384
model = dict(
    backbone=dict(
        arch='small',
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/cpvt-s_deit-in1k.pth')),
    neck=dict(in_channels=embed_dims))
