# iRPE paper Tab. 6, #2: DETR-R50 without any position encoding (no sine
# absolute encoding in encoder or decoder, no RPE).
_base_ = './detr_irpe_ctx_r50_150e.py'
model = dict(
    positional_encoding=None,
    encoder=dict(layer_cfg=dict(self_attn_cfg=dict(rpe_cfg=None))))
