# ViTDet's Mask R-CNN (LSJ at 1024 x 1024, 100 epochs; the base files) on
# EVA-02-B (Fang et al., 2024; the MIM weights the authors publish through
# timm), with EVA-02's detection layout: 16 x 16 windows, global blocks
# (2, 5, 8, 11), the RoPE positions interpolated from the 16 x 16
# pretraining grid to a grid of 64 in global blocks (rope_cfg.scale =
# 16 / 64) and to the window in window blocks (window_scale = 16 / 16), as
# EVA-02's VisionRotaryEmbeddingFast; SwiGLU with sub-LN; layer-wise lr
# decay 0.7 and drop path 0.1, as EVA-02's B detection configs.
#
# Reference number: none published for Mask R-CNN. EVA-02's own detector is
# Cascade Mask R-CNN (EVA-02/det/README.md, eva02_B_coco_bsl, config
# projects/ViTDet/configs/eva2_mim_to_coco/
# eva2_coco_cascade_mask_rcnn_vitdet_b_4attn_1024_lrd0p7.py: 55.5 box AP /
# 47.1 mask AP, with EVA's patch-16 weights); this is its Mask R-CNN twin
# with timm's patch-14 weights; untested at COCO scale.
#
# Patch 14: the pyramid's strides are 3.5, 7, 14, 28 and 56 (the anchors and
# the RoI extractors are told so below).
#   (timm: model = timm.create_model('eva02_base_patch14_224.mim_in22k',
#    pretrained=True); torch.save(model.state_dict(), 'eva02_b_mim.pth'))
#   python tools/model_converters/eva02_to_mmpe.py eva02_b_mim.pth \
#       checkpoints/eva02-b_mmpe.pth --ft-grid 64 64 --window-size 16 \
#       --drop-prefix-tokens
_base_ = [
    './_base_/models/mask-rcnn_vit-b_vitdet.py',
    './_base_/schedules/vitdet_lsj-100e_coco.py'
]

strides = [3.5, 7, 14, 28, 56]  # patch 14: 14 / 4 .. 14 * 4
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
        drop_path_rate=0.1,
        final_norm=False,  # EVA-02's MIM models and its detection ViT: none
        init_cfg=dict(
            type='Pretrained', checkpoint='checkpoints/eva02-b_mmpe.pth')),
    neck=dict(in_channels=768),
    rpn_head=dict(anchor_generator=dict(strides=strides)),
    roi_head=dict(
        bbox_roi_extractor=dict(featmap_strides=strides[:4]),
        mask_roi_extractor=dict(featmap_strides=strides[:4])))
optim_wrapper = dict(paramwise_cfg=dict(layer_decay_rate=0.7))
