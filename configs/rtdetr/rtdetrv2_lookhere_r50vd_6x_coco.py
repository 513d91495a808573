# RT-DETRv2-L (rtdetrv2_r50vd_6x_coco.py, target 53.4 box AP) with LookHere
# (Fuller et al., "LookHere: Vision Transformers with Directed Attention
# Generalize and Extrapolate", NeurIPS 2024) in AIFI, on top of the authors'
# 2D sin-cos. 'corners' (LookHere-90): each of the 8 heads sees one
# quadrant (up-left, up-right, down-left, down-right, twice), the other keys
# masked, and its logits get -slope x the Euclidean distance (the released
# slopes: 1/2 for heads 0-3, 1/4 for heads 4-7; global and layer slopes 1).
# No parameters: a converted RT-DETRv2 checkpoint loads with nothing
# missing. Everything else is the R50vd 6x recipe.
#   bash tools/dist_train.sh configs/rtdetr/rtdetrv2_lookhere_r50vd_6x_coco.py 4
_base_ = './rtdetrv2_r50vd_6x_coco.py'

model = dict(
    neck=dict(
        encoder_pe=dict(
            absolute='sine',
            relative=dict(
                type='lookhere',
                directions='corners',
                distance='linear',
                global_slope=1.0,
                layer_slopes=(1.0, 1.0)))))
