# DINO (4 scales, mmdet 3.3's head, encoder and decoder) on a plain ViT-B/16
# in ViTDet's layout whose position information is CPVT's PEG (a depth-wise
# conv after block 0, on the full grid): 14 x 14 windows in every block but
# 2, 5, 8, 11, the simple feature pyramid at strides 8, 16, 32, 64, AdamW
# with layer-wise lr decay 0.7 and drop path 0.1
# (_base_/models/dino-4scale_vit-b_vitdet.py), DINO's data and 12-epoch
# schedule (lr x 0.1 at epoch 11, batch 16). Evaluated with COCO bbox AP.
# The 50-epoch schedule: dino-4scale_vit-b-peg_vitdet_50e_coco.py.
#
# ImageNet initialisation: MAE's ViT-B (the ViTDet paper's), converted once
# (the table and the class token are dropped; windows add no parameters and
# the PEG starts from its own initialisation):
#   wget https://dl.fbaipublicfiles.com/mae/pretrain/mae_pretrain_vit_base.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       mae_pretrain_vit_base.pth checkpoints/vit-b_mae-in1k_cpvt.pth
# To train from scratch instead: --cfg-options model.backbone.init_cfg=None
_base_ = './_base_/models/dino-4scale_vit-b_vitdet.py'

model = dict(
    backbone=dict(
        pos_encoding='peg',
        peg_positions=(0, ),
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-b_mae-in1k_cpvt.pth')))
