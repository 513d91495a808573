# DINO (4 scales) on a plain ViT-B/16 in ViTDet's layout whose position
# information is iRPE (Wu et al., ICCV 2021): contextual product iRPE on keys
# in every block, on the 14 x 14 window grid in window blocks (one bucket
# plan for all windows) and on the full grid in the global blocks 2, 5, 8,
# 11. Everything else is configs/dino-4scale_vit-b-peg_vitdet_12e_coco.py.
# The 50-epoch schedule: dino-4scale_vit-b-irpe_vitdet_50e_coco.py.
#
# ImageNet initialisation: MAE's ViT-B, converted once (same file as the
# PEG config; the iRPE tables start at zero, as in the iRPE paper, so the
# first step is the MAE model's attention):
#   wget https://dl.fbaipublicfiles.com/mae/pretrain/mae_pretrain_vit_base.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       mae_pretrain_vit_base.pth checkpoints/vit-b_mae-in1k_cpvt.pth
_base_ = [
    './_base_/models/dino-4scale_vit-b_vitdet.py',
    './_base_/irpe_tables/imagenet.py'
]

model = dict(
    backbone=dict(
        pos_encoding='irpe',
        rpe_cfg=dict(
            mode='contextual',
            method='product',
            ratio=1.9,  # 7 x 7 buckets, as the iRPE authors' DeiT
            shared_head=True,
            rpe_on='k',
            init={{_base_.rpe_table_init}}),
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-b_mae-in1k_cpvt.pth')))
