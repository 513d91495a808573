# RT-DETRv2 with a ResNet-50-vd (Lv et al., "RT-DETRv2: Improved Baseline
# with Bag-of-Freebies for Real-Time Detection Transformer", 2024, on Zhao
# et al., "DETRs Beat YOLOs on Real-time Object Detection", CVPR 2024), as
# the released lyuwenyu/RT-DETR sets it in rtdetrv2_pytorch/configs/
# rtdetrv2/include/rtdetrv2_r50vd.yml (the file every RT-DETRv2 recipe
# includes; the recipes in configs/rtdetr/ change what theirs change):
#   - backbone: PResNet depth 50, variant d (deep stem 32-32-64, average-pool
#     shortcut, stride on the 3x3; mmpe's PResNetVd: mmdet's ResNetV1d, plus
#     the released stage-1 projection shortcut at R18 / R34), stages 2-4 out
#     (strides 8, 16, 32),
#     stem frozen (freeze_at 0), BatchNorm frozen (freeze_norm), ImageNet
#     weights (the authors' ResNet50_vd_ssld_v2 file, converted by
#     tools/model_converters/rtdetrv2_to_mmpe.py --backbone);
#   - HybridEncoder: 256 channels, AIFI (1 layer, 8 heads, FFN 1024, GELU,
#     dropout 0) on the stride-32 level with the 2D sin-cos, CCFM with
#     expansion 1.0, depth 1, SiLU. The sin-cos is made for each input's
#     grid (the released code caches it for eval_spatial_size 640 x 640):
#     the released table on the recipes' square inputs; on a non-square
#     grid the released code's token order is a shuffle, and the neck's
#     default sine_layout='grid' gives every token its own (y, x) instead
#     ('released' reproduces the shuffle, for parity at such sizes);
#   - RTDETRTransformerv2: 6 layers, 300 queries, 3 levels of 256 channels,
#     4 sampling points per level, grid-sample cross-attention ('default'),
#     'default' query selection, 100 denoising queries (label noise 0.5,
#     box noise 1.0), the last layer at inference (eval_idx -1);
#   - criterion: VFL 1 (alpha 0.75, gamma 2), L1 5, GIoU 2; Hungarian
#     matching with costs class 2 (focal, alpha 0.25, gamma 2, eps 1e-8),
#     L1 5, GIoU 2;
#   - post-processing: the top 300 of the sigmoid scores.
# Images enter as RGB in [0, 1] (the authors' ConvertPILImage scale=True):
# mean 0, std 255.
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

num_classes = 80
model = dict(
    type='RTDETR',
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[0, 0, 0],
        std=[255, 255, 255],
        bgr_to_rgb=True,
        pad_size_divisor=32,
        # the authors' batch-level multi-scale (BatchImageCollateFunction);
        # stopped by BatchResizeStopHook (configs/_base_/schedules/
        # rtdetrv2_coco.py)
        batch_augments=[dict(type='RTDETRBatchResize')]),
    backbone=dict(
        type='PResNetVd',  # mmdet's ResNetV1d at R50 / R101
        depth=50,
        num_stages=4,
        out_indices=(1, 2, 3),
        frozen_stages=0,  # the stem (freeze_at 0)
        norm_cfg=dict(type='BN', requires_grad=False),  # freeze_norm
        norm_eval=True,
        style='pytorch',  # stride on the 3x3 (variant d)
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/resnet50vd_ssld_v2_rtdetr_mmpe.pth')),
    neck=dict(
        type='RTDETRHybridEncoder',
        in_channels=[512, 1024, 2048],
        feat_strides=[8, 16, 32],
        hidden_dim=256,
        use_encoder_idx=[2],
        num_encoder_layers=1,
        num_heads=8,
        dim_feedforward=1024,
        dropout=0.0,
        enc_act='gelu',
        expansion=1.0,
        depth_mult=1.0,
        act='silu',
        encoder_pe=dict(absolute='sine')),
    bbox_head=dict(
        type='RTDETRHead',
        num_classes=num_classes,
        embed_dims=256,
        in_channels=[256, 256, 256],
        num_levels=3,
        num_queries=300,
        num_layers=6,
        num_points=[4, 4, 4],
        cross_attn_method='default',
        query_select_method='default',
        num_denoising=100,
        label_noise_ratio=0.5,
        box_noise_scale=1.0,
        eval_idx=-1,
        loss_weights=dict(loss_vfl=1.0, loss_bbox=5.0, loss_giou=2.0),
        vfl_alpha=0.75,
        vfl_gamma=2.0),
    train_cfg=dict(
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                # eps: the released matcher's (mmdet's default 1e-12)
                dict(type='FocalLossCost', weight=2.0, alpha=0.25,
                     gamma=2.0, eps=1e-8),
                dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                dict(type='IoUCost', iou_mode='giou', weight=2.0)
            ])),
    test_cfg=dict(max_per_img=300))
