# ViTDet-style Mask R-CNN (Li et al., ECCV 2022) with a plain ViT-B/16 whose
# position information is CPVT's PEG (a depth-wise conv after block 0, on the
# full grid): 14 x 14 windows in every block but 2, 5, 8, 11, simple feature
# pyramid, LSJ at 1024 px, 100 epochs, AdamW with layer-wise lr decay 0.7
# (_base_/models/mask-rcnn_vit-b_vitdet.py, _base_/schedules/
# vitdet_lsj-100e_coco.py). Evaluated with COCO bbox and segm AP.
#
# ImageNet initialisation: MAE's ViT-B (the ViTDet paper's), converted once
# (the table and the class token are dropped; windows add no parameters and
# the PEG starts from its own initialisation):
#   wget https://dl.fbaipublicfiles.com/mae/pretrain/mae_pretrain_vit_base.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       mae_pretrain_vit_base.pth checkpoints/vit-b_mae-in1k_cpvt.pth
# To train from scratch instead: --cfg-options model.backbone.init_cfg=None
_base_ = [
    './_base_/models/mask-rcnn_vit-b_vitdet.py',
    './_base_/schedules/vitdet_lsj-100e_coco.py'
]

model = dict(
    backbone=dict(
        pos_encoding='peg',
        peg_positions=(0, ),
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-b_mae-in1k_cpvt.pth')))
