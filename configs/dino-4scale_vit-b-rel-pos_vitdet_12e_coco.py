# DINO (4 scales) on ViTDet's own ViT-B/16 backbone, trained with detrex's
# DINO-ViTDet recipe: the config of detrex's
# projects/dino/configs/dino-vitdet/dino_vitdet_base_4scale_12ep.py
# (DINO-ViTDet-Base-4scale, MAE ViT-B, 12 epochs: box AP 50.2 on COCO
# val2017), the number this config targets. The 50-epoch schedule (55.0):
# dino-4scale_vit-b-rel-pos_vitdet_50e_coco.py.
#
# Position information as detectron2's ViT (use_abs_pos, use_rel_pos): the
# pre-trained absolute table (14 x 14, resampled to each batch's grid by
# detectron2's plain bicubic: pos_embed_interp='detectron2') and the
# decomposed relative position of MViTv2 in every block (q_i . R_h[iy - jy]
# + q_i . R_w[ix - jx] added to the attention logits): the 14 x 14 window
# blocks own tables of 2 * 14 - 1 rows, the global blocks 2, 5, 8, 11
# tables for the 64 x 64 grid of a 1024 px input (rel_pos_cfg.input_size,
# detectron2's img_size=1024), resized linearly to other grids (DINO's
# images are up to 1333 x 800: 84 x 50 tokens); the relative tables start
# at zero. Both decay like every weight (detrex's rule: only norms are
# exempt).
#
# Everything else, and every place mmpe differs from detrex (mmdet's DINO
# transformer and its sine encoding; the batch padding and the windows'
# padding masked in the backbone; the pyramid's initialisation and its
# max-pool on odd grids), with the reasons:
# _base_/models/dino-4scale_vit-b_vitdet.py. Warm-up: off, as detrex's
# config; the option is in that file's header.
#
# Pre-trained weights: MAE's ViT-B (detrex's init_checkpoint), the same
# file for every ViT-B encoding; this encoding KEEPS MAE's absolute table
# (its class row and the class token are dropped; MAE's final norm is not
# used, as detectron2's ViT has none):
#   wget https://dl.fbaipublicfiles.com/mae/pretrain/mae_pretrain_vit_base.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       mae_pretrain_vit_base.pth checkpoints/vit-b_mae-in1k_cpvt-abs.pth \
#       --pos-encoding learnable rel-pos
_base_ = './_base_/models/dino-4scale_vit-b_vitdet.py'

model = dict(
    backbone=dict(
        pos_encoding=('learnable', 'rel-pos'),
        pos_embed_interp='detectron2',  # get_abs_pos, as detrex's ViT
        rel_pos_cfg=dict(
            input_size=(64, 64),  # 1024 / 16, as ViTDet's global blocks
            init='zeros'),
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-b_mae-in1k_cpvt-abs.pth')))
