# DINO (4 scales) on a plain ViT-B/16 in ViTDet's layout whose position
# information is iRPE (Wu et al., ICCV 2021): contextual product iRPE on keys
# in every block, on the 14 x 14 window grid in window blocks (one bucket
# plan for all windows) and on the full grid in the global blocks 2, 5, 8,
# 11, trained with detrex's DINO-ViTDet recipe
# (_base_/models/dino-4scale_vit-b_vitdet.py; the iRPE tables decay like
# every weight, detrex's rule exempting only norms).
#
# Reference number: detrex's dino_vitdet_base_4scale_12ep.py
# (DINO-ViTDet-Base-4scale, MAE ViT-B, box AP 50.2), whose backbone is
# configs/dino-4scale_vit-b-rel-pos_vitdet_12e_coco.py. This config is that
# run with ViTDet's absolute table and relative tables replaced by iRPE,
# everything else equal: the difference to 50.2 (or to the rel-pos config
# run alike) is the encoding's. Every other place mmpe differs from detrex,
# with the reasons: the base file's header.
# The 50-epoch schedule (detrex: 55.0):
# dino-4scale_vit-b-irpe_vitdet_50e_coco.py.
#
# Pre-trained weights: MAE's ViT-B, the same file as the PEG and RoPE-Mixed
# configs; this encoding drops MAE's absolute table (and the class token;
# MAE's final norm is not used); the iRPE tables start at zero, as in the
# iRPE paper, so the first step is the MAE model's attention:
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
