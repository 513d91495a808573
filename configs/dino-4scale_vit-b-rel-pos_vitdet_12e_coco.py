# DINO (4 scales) on ViTDet's own ViT-B/16 backbone: the absolute position
# table of the pre-trained ViT (learnable, 14 x 14, resampled bicubically to
# each input's grid) and the decomposed relative position of MViTv2 in every
# block (q_i . R_h[iy - jy] + q_i . R_w[ix - jx] added to the attention
# logits): the 14 x 14 window blocks own tables of 2 * 14 - 1 rows, the
# global blocks 2, 5, 8, 11 tables for the 64 x 64 grid of a 1024 px input
# (rel_pos_cfg.input_size, as ViTDet's), resized linearly to other grids
# (DINO's images are up to 1333 x 800: 84 x 50 tokens); the tables start at
# zero and, as in ViTDet's recipe, only the absolute table is exempt from
# weight decay. Everything else is
# configs/dino-4scale_vit-b-peg_vitdet_12e_coco.py.
# The 50-epoch schedule: dino-4scale_vit-b-rel-pos_vitdet_50e_coco.py.
#
# ImageNet initialisation: MAE's ViT-B (the ViTDet paper's), converted once
# KEEPING its position table (the class token and the table's class row are
# dropped; the relative tables start at zero, so the first step is the MAE
# model's attention):
#   wget https://dl.fbaipublicfiles.com/mae/pretrain/mae_pretrain_vit_base.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       mae_pretrain_vit_base.pth checkpoints/vit-b_mae-in1k_cpvt-abs.pth \
#       --pos-encoding learnable rel-pos
_base_ = './_base_/models/dino-4scale_vit-b_vitdet.py'

model = dict(
    backbone=dict(
        pos_encoding=('learnable', 'rel-pos'),
        rel_pos_cfg=dict(
            input_size=(64, 64),  # 1024 / 16, as ViTDet's global blocks
            init='zeros'),
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-b_mae-in1k_cpvt-abs.pth')))
