# configs/mask-rcnn_vit-b-rope-mixed_vitdet_lsj-100e_coco.py with a ViT-S/16
# (384 dims, 12 blocks, 6 heads): same windows (14 x 14; global blocks 2, 5,
# 8, 11), pyramid, heads, data and recipe (layer-wise lr decay 0.7, drop
# path 0.1).
#
# ImageNet initialisation: the authors' RoPE-Mixed ViT-S (timm
# `vit_small_patch16_rope_mixed_224.naver_in1k`), converted once:
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       vit_small_patch16_rope_mixed_224.naver_in1k/model.safetensors \
#       checkpoints/vit-s_rope-mixed-in1k_cpvt.pth --pos-encoding rope-mixed
_base_ = './mask-rcnn_vit-b-rope-mixed_vitdet_lsj-100e_coco.py'

embed_dims = 384
model = dict(
    backbone=dict(
        arch='small',
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-s_rope-mixed-in1k_cpvt.pth')),
    neck=dict(in_channels=embed_dims))
