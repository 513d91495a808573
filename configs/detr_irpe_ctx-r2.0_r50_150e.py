# The authors' first released DETR-iRPE setting: contextual product iRPE on
# keys with ratio 2.0 (9x9 buckets), 150 epochs, lr drop at 100.
_base_ = './detr_irpe_ctx_r50_150e.py'
model = dict(
    encoder=dict(layer_cfg=dict(self_attn_cfg=dict(rpe_cfg=dict(ratio=2.0)))))
