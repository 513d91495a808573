# RT-DETRv2-L (rtdetrv2_r50vd_6x_coco.py, target 53.4 box AP) with Swin-V2's
# log-spaced continuous position bias (Liu et al., "Swin Transformer V2",
# CVPR 2022, Sec. 3.3) in AIFI, on top of the authors' 2D sin-cos: an MLP
# (2 -> 512 -> 8 heads) of the log-spaced offsets of the batch's grid, so a
# larger test grid gets new offsets, not an interpolated table.
# pretrained_size: the largest training grid, 800 / 32 = 25 tokens a side
# (the multi-scale's largest size), on both axes, so that every training
# offset lies in Swin-V2's [-8, 8] before the log. Everything else is the
# R50vd 6x recipe. No weight decay on the MLP, as Swin-V2
# (its no_weight_decay_keywords name 'cpb_mlp').
#   bash tools/dist_train.sh configs/rtdetr/rtdetrv2_log-cpb_r50vd_6x_coco.py 4
_base_ = './rtdetrv2_r50vd_6x_coco.py'

model = dict(
    neck=dict(
        encoder_pe=dict(
            absolute='sine',
            relative=dict(
                type='log-cpb', pretrained_size=(25, 25), hidden=512))))

optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'cpb_mlp': dict(decay_mult=0.)}))
