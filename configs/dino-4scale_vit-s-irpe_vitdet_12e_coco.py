# configs/dino-4scale_vit-b-irpe_vitdet_12e_coco.py with a ViT-S/16 (384
# dims, 12 blocks, 6 heads): same windows (14 x 14; global blocks 2, 5, 8,
# 11), pyramid and channel mapper (strides 8, 16, 32, 64 at 256 channels),
# DINO, data and detrex's DINO-ViTDet recipe (_base_/models/
# dino-4scale_vit-b_vitdet.py: backbone and pyramid at lr x 0.1, weight
# decay 1e-4 with norms at 0, drop path 0.1, no final norm, no warm-up).
#
# Reference number: none. detrex publishes DINO-ViTDet with ViT-B (50.2 /
# 55.0) and ViT-L (52.9 / 57.5) only; this config is the ViT-B iRPE config
# at ViT-S size, for comparisons at that size. Every place mmpe differs
# from detrex's recipe, with the reasons: the base file's header.
#
# Pre-trained weights: MAE released no ViT-S, so every ViT-S config starts
# from DeiT-Small (supervised ImageNet-1k), with the ViT-B configs' rule:
# what an encoding keeps of the absolute table is its own (iRPE: dropped,
# with the class token; the final norm is not used); the iRPE tables start
# at zero:
#   wget \
#     https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth
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
