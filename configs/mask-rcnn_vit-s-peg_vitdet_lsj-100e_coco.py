# configs/mask-rcnn_vit-b-peg_vitdet_lsj-100e_coco.py with a ViT-S/16
# (384 dims, 12 blocks, 6 heads): same windows (14 x 14; global blocks 2, 5,
# 8, 11), pyramid, heads, data and recipe (layer-wise lr decay 0.7, drop
# path 0.1).
#
# ImageNet initialisation: DeiT-Small (the file of
# configs/mask-rcnn_cpvt-s_fpn_1x_coco.py), converted once:
#   wget https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       deit_small_patch16_224-cd65a155.pth checkpoints/cpvt-s_deit-in1k.pth
_base_ = './mask-rcnn_vit-b-peg_vitdet_lsj-100e_coco.py'

embed_dims = 384
model = dict(
    backbone=dict(
        arch='small',
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/cpvt-s_deit-in1k.pth')),
    neck=dict(in_channels=embed_dims))
