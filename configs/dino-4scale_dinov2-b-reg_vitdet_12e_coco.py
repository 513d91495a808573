# DINO (4 scales) on DINOv2's ViT-B/14 with registers (Oquab et al., TMLR
# 2024; Darcet et al., ICLR 2024), in ViTDet's layout (14 x 14 windows,
# global blocks (2, 5, 8, 11)) under detrex's DINO-ViTDet recipe, 12 epochs.
#
# Reference number: none published. detrex has no DINO-DINOv2 config; the
# nearest published detector (RF-DETR, a DINOv2 backbone with windowed
# attention) uses another recipe and decoder. This config is the detrex
# DINO-ViTDet run (MAE ViT-B, 50.2 box AP at 12 epochs) with the backbone
# replaced; untested at COCO scale.
#
# The backbone as DINOv2's own model computes it (checked against their
# code: tests/test_tools/test_dinov2_converter.py): patch 14, LayerScale,
# the 37 x 37 table resampled to each image's grid as their
# interpolate_pos_encoding does for the models with registers
# (pos_embed_interp='dinov2-reg', per image of a padded batch), the final
# norm kept (DINOv2's features are normed). The class token and the
# registers are dropped (windows have no place for them; as ViTDet drops
# MAE's class token), so are the table's class row. Strides 7 / 14 / 28 / 56
# (patch 14): DINO's deformable attention reads normalised positions.
#   wget https://dl.fbaipublicfiles.com/dinov2/dinov2_vitb14/dinov2_vitb14_reg4_pretrain.pth
#   python tools/model_converters/dinov2_to_mmpe.py --drop-prefix-tokens \
#       dinov2_vitb14_reg4_pretrain.pth checkpoints/dinov2-b-reg_mmpe.pth
_base_ = './_base_/models/dino-4scale_vit-b_vitdet.py'

model = dict(
    backbone=dict(
        arch=dict(
            _delete_=True,  # the base's 'base' preset
            embed_dims=768,
            depth=12,
            num_heads=12,
            mlp_ratio=4.),
        patch_size=14,
        img_size=518,  # the 37 x 37 table
        pos_encoding='learnable',
        pos_embed_interp='dinov2-reg',
        block_cfg=dict(layer_scale_init=1.0),
        global_blocks=(2, 5, 8, 11),
        final_norm=True,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/dinov2-b-reg_mmpe.pth')),
    neck=dict(in_channels=768))
