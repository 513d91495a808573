# DINO (4 scales) on DINOv3's distilled ViT-L/16 (Simeoni et al., 2025), in
# ViTDet's layout (14 x 14 windows, global blocks (5, 11, 17, 23)) under
# detrex's DINO-ViTDet recipe, 12 epochs.
#
# Reference number: none published for this recipe. detrex has no DINO-DINOv3
# config (its pull request is open); DINOv3's own detector (Plain-DETR) and
# DEIMv2 use other decoders and recipes. This config is the detrex
# DINO-ViTDet run (MAE ViT-B, 50.2 box AP at 12 epochs) with the backbone
# replaced; untested at COCO scale.
#
# The backbone as DINOv3's own model computes it (checked against their code:
# tests/test_tools/test_dinov3_converter.py): RoPE (base 100) on patch centres
# normalised to each image's valid extent, its training-time rescale of the
# coordinates up to 2 (drawn anew in every block), LayerScale, LayerNorm eps
# 1e-5, the final norm kept. Every token is rotated by its full-grid
# position in window and global blocks alike. The class and storage tokens
# are dropped (windows have no place for them).
#   (the weights: the download links the DINOv3 authors send on request)
#   python tools/model_converters/dinov3_to_mmpe.py --drop-prefix-tokens \
#       dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth \
#       checkpoints/dinov3-l_mmpe.pth
_base_ = './_base_/models/dino-4scale_vit-b_vitdet.py'

model = dict(
    backbone=dict(
        arch=dict(
            _delete_=True,  # the base's 'base' preset
            embed_dims=1024,
            depth=24,
            num_heads=16,
            mlp_ratio=4.),
        pos_encoding='rope2d',
        rope_cfg=dict(theta=100., coords='normalized', normalize='separate',
                      rescale=2.),
        block_cfg=dict(layer_scale_init=1e-5),
        norm_cfg=dict(type='LN', eps=1e-5),
        global_blocks=(5, 11, 17, 23),
        final_norm=True,
        init_cfg=dict(
            type='Pretrained', checkpoint='checkpoints/dinov3-l_mmpe.pth')),
    neck=dict(in_channels=1024))
