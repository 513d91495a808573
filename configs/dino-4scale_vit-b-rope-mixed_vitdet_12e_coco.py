# DINO (4 scales) on a plain ViT-B/16 in ViTDet's layout whose position
# information is RoPE-Mixed (Heo et al., ECCV 2024): learnable per-head
# rotary frequencies in every block; every token is rotated by its position
# on the full grid, in window and global blocks alike. Trained with detrex's
# DINO-ViTDet recipe (_base_/models/dino-4scale_vit-b_vitdet.py; the
# frequencies decay like every weight, detrex's rule exempting only norms).
#
# Reference number: detrex's dino_vitdet_base_4scale_12ep.py
# (DINO-ViTDet-Base-4scale, MAE ViT-B, box AP 50.2), whose backbone is
# configs/dino-4scale_vit-b-rel-pos_vitdet_12e_coco.py. This config is that
# run with ViTDet's absolute table and relative tables replaced by
# RoPE-Mixed, everything else equal -- the pre-trained weights included:
# the difference to 50.2 (or to the rel-pos config run alike) is the
# encoding's. Every other place mmpe differs from detrex, with the reasons:
# the base file's header.
# The 50-epoch schedule (detrex: 55.0):
# dino-4scale_vit-b-rope-mixed_vitdet_50e_coco.py.
#
# Pre-trained weights: MAE's ViT-B, the same file as the PEG and iRPE
# configs; this encoding drops MAE's absolute table (and the class token;
# MAE's final norm is not used) and its frequencies are new (the RoPE-Mixed
# authors' initialisation: MAE was pre-trained without rotations):
#   wget https://dl.fbaipublicfiles.com/mae/pretrain/mae_pretrain_vit_base.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       mae_pretrain_vit_base.pth checkpoints/vit-b_mae-in1k_cpvt.pth
_base_ = './_base_/models/dino-4scale_vit-b_vitdet.py'

model = dict(
    backbone=dict(
        pos_encoding='rope-mixed',
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-b_mae-in1k_cpvt.pth')))
