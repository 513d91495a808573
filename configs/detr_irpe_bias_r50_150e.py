# iRPE paper Tab. 6, #3: sine absolute encoding + iRPE in *bias* mode
# (product, piecewise, ratio 1.9, shared heads, on keys).
_base_ = './detr_irpe_ctx_r50_150e.py'
model = dict(
    encoder=dict(
        layer_cfg=dict(
            self_attn_cfg=dict(rpe_cfg=dict(mode='bias'), rpe_on='k'))))
