# RT-DETRv2-L (rtdetrv2_r50vd_6x_coco.py, target 53.4 box AP) with iRPE (Wu
# et al., "Rethinking and Improving Relative Position Encoding for Vision
# Transformer", ICCV 2021, Eq. 13-17) in AIFI, the hybrid encoder's
# self-attention on the stride-32 map, on top of the authors' 2D sin-cos:
# contextual product iRPE on keys, piecewise index with ratio 1.9, one
# table for all heads (the iRPE authors' DeiT setting, as the DINO-ViT iRPE
# configs). Everything else is the R50vd 6x
# recipe, so the difference to it is the encoding's. The tables start at
# zero (the first step is the authors' AIFI) and get no weight decay, the
# iRPE paper's ImageNet recipe (_base_/irpe_tables/imagenet.py); iRPE's
# buckets are built for each batch's grid (15 x 15 to 25 x 25 under the
# multi-scale training, 20 x 20 at 640 x 640, any other at test).
# A converted RT-DETRv2 checkpoint loads with only the tables missing.
#   bash tools/dist_train.sh configs/rtdetr/rtdetrv2_irpe_r50vd_6x_coco.py 4
_base_ = [
    './rtdetrv2_r50vd_6x_coco.py',
    '../_base_/irpe_tables/imagenet.py',
]

model = dict(
    neck=dict(
        encoder_pe=dict(
            absolute='sine',
            relative=dict(
                type='irpe',
                mode='contextual',
                method='product',
                ratio=1.9,
                shared_head=True,
                on='k',
                init={{_base_.rpe_table_init}}))))

optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={
        'self_attn.rpe_': dict(decay_mult={{_base_.rpe_table_decay_mult}})
    }))
