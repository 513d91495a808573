# ViTDet-style Mask R-CNN with a plain ViT-B/16 whose position information is
# RoPE-Mixed (Heo et al., ECCV 2024): learnable per-head rotary frequencies
# in every block; every token is rotated by its position on the full grid,
# in window and global blocks alike. Everything else is
# configs/mask-rcnn_vit-b-peg_vitdet_lsj-100e_coco.py.
#
# ImageNet initialisation: the authors' RoPE-Mixed ViT-B (timm
# `vit_base_patch16_rope_mixed_224.naver_in1k`), frequencies included,
# converted once (the class token is dropped):
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       vit_base_patch16_rope_mixed_224.naver_in1k/model.safetensors \
#       checkpoints/vit-b_rope-mixed-in1k_cpvt.pth --pos-encoding rope-mixed
_base_ = [
    './_base_/models/mask-rcnn_vit-b_vitdet.py',
    './_base_/schedules/vitdet_lsj-100e_coco.py'
]

model = dict(
    backbone=dict(
        pos_encoding='rope-mixed',
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-b_rope-mixed-in1k_cpvt.pth')))
