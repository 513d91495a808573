# DINO (4 scales) on a plain ViT-B/16 in ViTDet's layout whose position
# information is RoPE-Mixed (Heo et al., ECCV 2024): learnable per-head
# rotary frequencies in every block; every token is rotated by its position
# on the full grid, in window and global blocks alike. Everything else is
# configs/dino-4scale_vit-b-peg_vitdet_12e_coco.py.
# The 50-epoch schedule: dino-4scale_vit-b-rope-mixed_vitdet_50e_coco.py.
#
# ImageNet initialisation: the authors' RoPE-Mixed ViT-B (timm
# `vit_base_patch16_rope_mixed_224.naver_in1k`), frequencies included,
# converted once (the class token is dropped):
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       vit_base_patch16_rope_mixed_224.naver_in1k/model.safetensors \
#       checkpoints/vit-b_rope-mixed-in1k_cpvt.pth --pos-encoding rope-mixed
_base_ = './_base_/models/dino-4scale_vit-b_vitdet.py'

model = dict(
    backbone=dict(
        pos_encoding='rope-mixed',
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-b_rope-mixed-in1k_cpvt.pth')))
