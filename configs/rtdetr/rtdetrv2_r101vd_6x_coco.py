# RT-DETRv2-X: RT-DETRv2 with ResNet-101-vd and a 384-channel encoder, 72
# epochs on COCO 2017 (lyuwenyu/RT-DETR, rtdetrv2_pytorch/configs/rtdetrv2/
# rtdetrv2_r101vd_6x_coco.yml).
# Target: the released 54.3 box AP (AP50 72.8) on val2017 at 640 x 640
# (rtdetrv2_pytorch/README.md; that checkpoint,
# rtdetrv2_r101vd_6x_coco_from_paddle.pth, was trained with the authors'
# PaddlePaddle code and converted by them).
# As the R50vd 6x recipe (rtdetrv2_r50vd_6x_coco.py: the base files and
# their differences from the authors' code) but for what the YAML changes:
#   - backbone ResNet-101-vd (stem frozen, BatchNorm frozen, as R50);
#   - HybridEncoder with 384 channels and an AIFI FFN of 2048; the decoder
#     reads three 384-channel levels (feat_channels) into its 256;
#   - backbone lr 1e-6 (x 0.01): the YAML's first group.
# Backbone weights (PaddlePaddle's ResNet101_vd_ssld):
#   wget https://github.com/lyuwenyu/storage/releases/download/v0.1/ResNet101_vd_ssld_pretrained_from_paddle.pth
#   python tools/model_converters/rtdetrv2_to_mmpe.py --backbone \
#       ResNet101_vd_ssld_pretrained_from_paddle.pth \
#       checkpoints/resnet101vd_ssld_rtdetr_mmpe.pth
#   bash tools/dist_train.sh configs/rtdetr/rtdetrv2_r101vd_6x_coco.py 4
_base_ = [
    '../_base_/models/rtdetrv2_r50vd.py',
    '../_base_/schedules/rtdetrv2_coco.py',
]

model = dict(
    backbone=dict(
        depth=101,
        init_cfg=dict(
            checkpoint='checkpoints/resnet101vd_ssld_rtdetr_mmpe.pth')),
    neck=dict(hidden_dim=384, dim_feedforward=2048),
    bbox_head=dict(in_channels=[384, 384, 384]))

optim_wrapper = dict(paramwise_cfg=dict(lr_factors=dict(backbone=0.01)))
