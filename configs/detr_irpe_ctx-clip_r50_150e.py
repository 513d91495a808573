# iRPE paper Tab. 6, #5: sine absolute encoding + contextual iRPE with the
# *clip* index function (Shaw et al.) instead of piecewise; max distance 3
# gives the same 7x7 product buckets as piecewise with ratio 1.9.
_base_ = './detr_irpe_ctx_r50_150e.py'
model = dict(
    encoder=dict(
        layer_cfg=dict(
            self_attn_cfg=dict(
                rpe_cfg=dict(index='clip', max_distance=3)))))
