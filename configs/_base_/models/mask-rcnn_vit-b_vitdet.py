# ViTDet's Mask R-CNN (Li et al., ECCV 2022; detectron2 projects/ViTDet) on
# mmpe's plain ViT: a ViT-B/16 (CPVT, no class token) attending in 14 x 14
# windows except in blocks 2, 5, 8, 11 (global), drop path 0.1, the simple
# feature pyramid (strides 4-32 from the stride-16 map, + 64 by pooling) and
# LayerNorm in the pyramid and the heads, an RPN of 2 convs and a 4-conv
# 1-fc box head, as ViTDet's. The position encoding and the ImageNet weights
# are set by each config (configs/mask-rcnn_vit-*_vitdet_lsj-100e_coco.py).
#
# The detector passes each batch's padding to the backbone
# (PaddingAwareMaskRCNN): LSJ pads every training image to 1024 x 1024, and
# padded tokens are masked keys like the windows' own padding.
_base_ = 'mmdet::_base_/models/mask-rcnn_r50_fpn.py'
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

embed_dims = 768
norm_cfg = dict(type='LayerNorm2d')  # channels-last LayerNorm of NCHW maps
model = dict(
    type='PaddingAwareMaskRCNN',
    data_preprocessor=dict(
        pad_size_divisor=32,
        # LSJ: every training batch padded to 1024 x 1024 (masks too)
        batch_augments=[
            dict(type='BatchFixedSizePad', size=(1024, 1024), pad_mask=True)
        ]),
    backbone=dict(
        _delete_=True,  # the base's ResNet-50
        type='CPVT',
        arch='base',  # ViT-B/16: 768 dims, 12 blocks, 12 heads
        patch_size=16,
        img_size=224,  # pre-training size (grid of a 'learnable' table)
        use_cls_token=False,  # ViTDet has none; windows refuse one
        window_size=14,
        global_blocks=(2, 5, 8, 11),
        drop_path_rate=0.1,
        out_indices=(-1, )),
    neck=dict(
        _delete_=True,
        type='ViTSimpleFPN',
        in_channels=embed_dims,
        out_channels=256,
        scale_factors=(4.0, 2.0, 1.0, 0.5),  # strides 4, 8, 16, 32
        num_outs=5,  # + stride 64 by max-pooling (ViTDet's LastLevelMaxPool)
        extra_type='maxpool',
        norm_cfg=norm_cfg),
    rpn_head=dict(num_convs=2),
    roi_head=dict(
        bbox_head=dict(
            type='Shared4Conv1FCBBoxHead',
            conv_out_channels=256,
            norm_cfg=norm_cfg),
        mask_head=dict(norm_cfg=norm_cfg)))
