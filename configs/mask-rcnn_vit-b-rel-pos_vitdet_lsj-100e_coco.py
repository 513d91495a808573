# ViTDet-style Mask R-CNN with ViTDet's own ViT-B/16 backbone: the absolute
# position table of the pre-trained ViT (learnable, 14 x 14, resampled
# bicubically to each input's grid) and the decomposed relative position of
# MViTv2 in every block (q_i . R_h[iy - jy] + q_i . R_w[ix - jx] added to
# the attention logits): the 14 x 14 window blocks own tables of 2 * 14 - 1
# rows, the global blocks 2, 5, 8, 11 tables for the 64 x 64 grid of a
# 1024 x 1024 input (rel_pos_cfg.input_size), resized linearly to other
# grids; the tables start at zero (ViTDet's rel_pos_zero_init) and, as in
# ViTDet's recipe, only the absolute table is exempt from weight decay.
# Everything else is configs/mask-rcnn_vit-b-peg_vitdet_lsj-100e_coco.py.
#
# ImageNet initialisation: MAE's ViT-B (the ViTDet paper's), converted once
# KEEPING its position table (the class token and the table's class row are
# dropped; the relative tables start at zero, so the first step is the MAE
# model's attention):
#   wget https://dl.fbaipublicfiles.com/mae/pretrain/mae_pretrain_vit_base.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       mae_pretrain_vit_base.pth checkpoints/vit-b_mae-in1k_cpvt-abs.pth \
#       --pos-encoding learnable rel-pos
_base_ = [
    './_base_/models/mask-rcnn_vit-b_vitdet.py',
    './_base_/schedules/vitdet_lsj-100e_coco.py'
]

model = dict(
    backbone=dict(
        pos_encoding=('learnable', 'rel-pos'),
        rel_pos_cfg=dict(
            input_size=(64, 64),  # 1024 / 16: the LSJ training grid
            init='zeros'),
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-b_mae-in1k_cpvt-abs.pth')))
