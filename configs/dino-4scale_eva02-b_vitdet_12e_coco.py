# DINO (4 scales) on EVA-02-B (Fang et al., 2024; the MIM weights the authors
# publish through timm), in ViTDet's layout (16 x 16 windows, global blocks
# (2, 5, 8, 11), as EVA-02's detection configs) under detrex's DINO-ViTDet
# recipe, 12 epochs.
#
# Reference number: detrex projects/dino_eva/configs/dino-eva-02/
# dino_eva_02_vitdet_b_4attn_1024_lrd0p7_4scale_12ep.py:
# 55.8 box AP (detrex's model card). Its recipe is not this one: LSJ at
# 1024 x 1024, layer-wise lr decay 0.7, EVA's patch-16 weights
# (eva02_B_pt_*_p14to16). This config keeps mmpe's DINO-ViTDet recipe
# and timm's patch-14 weights, so 55.8 is the model's published ceiling, not
# this config's target; untested at COCO scale.
#
# The backbone as timm's Eva computes it (tests/test_tools/
# test_eva02_converter.py): SwiGLU with sub-LN, q / v biases, the 16 x 16
# absolute table resampled as timm does, 2D RoPE (base 10000) whose
# positions are interpolated from the 16 x 16 pretraining grid to EVA-02's
# detection grid of 64 (rope_cfg.scale = 16 / 64) in global blocks and to
# the 16 x 16 window (window_scale = 16 / 16) in window blocks, as
# EVA-02's VisionRotaryEmbeddingFast (pt_seq_len 16, ft_seq_len 64 / 16).
#   (timm: model = timm.create_model('eva02_base_patch14_224.mim_in22k',
#    pretrained=True); torch.save(model.state_dict(), 'eva02_b_mim.pth'))
#   python tools/model_converters/eva02_to_mmpe.py eva02_b_mim.pth \
#       checkpoints/eva02-b_mmpe.pth --ft-grid 64 64 --window-size 16 \
#       --drop-prefix-tokens
_base_ = './_base_/models/dino-4scale_vit-b_vitdet.py'

model = dict(
    backbone=dict(
        arch=dict(
            _delete_=True,  # the base's 'base' preset
            embed_dims=768,
            depth=12,
            num_heads=12,
            mlp_ratio=2048 / 768),
        patch_size=14,
        img_size=224,  # the 16 x 16 table
        pos_encoding=('learnable', 'rope2d'),
        rope_cfg=dict(
            theta=10000., scale=(16 / 64, 16 / 64), window_scale=16 / 16),
        block_cfg=dict(mlp_type='swiglu-subln'),
        window_size=16,
        global_blocks=(2, 5, 8, 11),
        init_cfg=dict(
            type='Pretrained', checkpoint='checkpoints/eva02-b_mmpe.pth')),
    neck=dict(in_channels=768))
