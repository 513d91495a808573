# DINO (Zhang et al., ICLR 2023) on mmpe's plain ViT-B/16 in ViTDet's
# layout, trained with detrex's DINO-ViTDet recipe (IDEA-Research/detrex,
# projects/dino/configs/dino-vitdet/dino_vitdet_base_4scale_12ep.py and
# _50ep.py, models/dino_vitdet.py, configs/common/optim.py and
# coco_schedule.py; box AP 50.2 at 12 epochs, 55.0 at 50, MAE ViT-B).
# Each config says which number it targets (the ViT-B rel-pos config runs
# detrex's backbone; the others swap its position encoding).
#
# Item by item, as detrex:
#   - DINO: mmdet 3.3's 4-scale DINO (mmdet::dino/dino-4scale_r50_8xb2-12e_
#     coco.py: 900 queries, 100 denoising queries, two-stage, box
#     refinement, 6 + 6 deformable layers over 4 levels, DINOHead and its
#     losses, DETR's multi-scale data up to 1333 x 800, batch 16);
#   - backbone: ViT-B/16 (CPVT, no class token), 14 x 14 windows except in
#     blocks 2, 5, 8, 11 (global), drop path 0.1, LayerNorm eps 1e-6, no
#     final norm (detectron2's ViT has none; MAE's final norm is not used);
#   - neck: ViTDet's simple pyramid (scale factors 2, 1, 0.5 from the
#     stride-16 map and a 1x1 max-pool of the stride-32 level: strides 8,
#     16, 32, 64), 256 channels, LayerNorm in its 1x1 and 3x3 convs, then
#     per level a 1x1 conv (with bias) and GroupNorm(32) (detrex's
#     ChannelMapper after the pyramid: `out_norm_cfg`, under
#     `neck.out_convs`);
#   - optimiser: AdamW, lr 1e-4, betas (0.9, 0.999), weight decay 1e-4;
#     the backbone and the pyramid at lr x 0.1 (detrex:
#     `lr_factor_func=lambda name: 0.1 if "backbone" in name else 1`, and its
#     backbone is the ViT with the pyramid), DINO's channel mapper, encoder,
#     decoder, queries and head at lr 1e-4; no layer-wise decay; weight decay
#     0 on the parameters of LayerNorm and GroupNorm (detectron2's
#     `weight_decay_norm=0.0`), 1e-4 on everything else -- biases, the
#     absolute table, the relative tables, the pyramid's LayerNorms
#     (detectron2's channels-first LayerNorm is not among its norm types, so
#     they decay there too); gradients clipped at max norm 0.1;
#   - schedule: 12 epochs, lr x 0.1 at epoch 11 (_50e_ configs: 50, at 40);
#     no warm-up (detrex's lr_multiplier_12ep / _50ep).
#
# Where mmpe differs, and why:
#   - the transformer, head and losses are mmdet's DINO (not detrex's code);
#     its sine encoding of the levels uses the DINO authors' temperature 20
#     and offset 0 (detrex: 10000 and -0.5, which its README credits with
#     about 0.1 AP at 12 epochs);
#   - padding is masked in the backbone (PaddingAwareDINO), where detrex's
#     ViT takes it as image content: the batch's padded tokens are masked
#     keys, and so is the padding that makes whole windows (CPVT's default
#     window_padding='masked'; detectron2 attends to zero tokens there,
#     'zeros', also in a batch of one). So the ViT's features of an image
#     do not depend on the batch it is in (tested with PEG, iRPE and
#     RoPE-Mixed; ViTDet's own absolute and relative tables are resized to
#     the batch's padded grid, in detrex as here). From the pyramid on the
#     padding is seen as in detrex: the channel mapper's GroupNorm takes its
#     statistics over the padded map and DINO's decoder encodes its queries'
#     boxes relative to the padded batch;
#   - the pyramid's convs start from Xavier-uniform weights (detectron2's
#     keep PyTorch's default; detrex's ChannelMapper is Xavier-uniform, as
#     here) and its max-pool rounds odd grids up (ceil_mode; detectron2's
#     drops the last row / column of an odd stride-16 grid).
#
# Warm-up: off, as in detrex's configs; detrex's README warns that
# DINO-ViTDet is "not stable to train ... without warmup lr-scheduler".
# `lr_warmup` below (linear from lr x 0.001 over 1000 iterations: the 16k
# images of ViTDet's 250 iterations at batch 64 and of detectron2's default
# warm-up) turns it on in a config of two lines (docs/user_guides/vitdet.md,
# "DINO"):
#   _base_ = './dino-4scale_vit-b-rel-pos_vitdet_12e_coco.py'
#   param_scheduler = [{{_base_.lr_warmup}}, {{_base_.lr_steps}}]
# (detrex's own lr_multiplier_12ep_warmup warms up over 1e-3 epochs, 7.5
# iterations of its 7500 an epoch.)
#
# The position encoding and the pretrained weights are set by each config
# (configs/dino-4scale_vit-*_vitdet_12e_coco.py).
_base_ = [
    'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py', '../runtime_mmpe.py'
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

embed_dims = 768
model = dict(
    type='PaddingAwareDINO',
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
        final_norm=False,  # detectron2's ViT: the last block's tokens
        out_indices=(-1, )),
    neck=dict(
        _delete_=True,  # the base's ChannelMapper of ResNet stages 2-4
        type='ViTSimpleFPN',
        in_channels=embed_dims,
        out_channels=256,  # DINO's embed_dims
        scale_factors=(2.0, 1.0, 0.5),  # strides 8, 16, 32
        num_outs=4,  # + stride 64: DINO's 4 levels (encoder num_levels=4)
        extra_type='maxpool',
        norm_cfg=dict(type='LayerNorm2d'),
        # DINO's channel mapper: 1x1 conv + GroupNorm(32) per level
        out_norm_cfg=dict(type='GN', num_groups=32)))

optim_wrapper = dict(
    _delete_=True,  # the base's AdamW (its custom key drops the norm rule)
    type='OptimWrapper',
    constructor='LrFactorOptimWrapperConstructor',
    optimizer=dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4),
    clip_grad=dict(max_norm=0.1, norm_type=2),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        # the pyramid's LayerNorms decay, as in detrex (see the header)
        custom_keys={
            'neck.lateral_convs': dict(decay_mult=1.),
            'neck.fpn_convs': dict(decay_mult=1.),
        },
        # detrex's backbone = the ViT + the pyramid: lr x 0.1; its neck =
        # the channel mapper (neck.out_convs): lr x 1
        lr_factors={
            'backbone': 0.1,
            'neck': 0.1,
            'neck.out_convs': 1.0,
        }))

# detrex's schedule, without warm-up (header); `lr_warmup` is the documented
# option, not used unless a config puts it in `param_scheduler`
max_epochs = 12
lr_steps = dict(
    type='MultiStepLR',
    begin=0,
    end=max_epochs,
    by_epoch=True,
    milestones=[11],
    gamma=0.1)
lr_warmup = dict(
    type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000)
param_scheduler = [lr_steps]
