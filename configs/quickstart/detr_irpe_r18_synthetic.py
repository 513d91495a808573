# Quick-start DETR-iRPE on the embedded synthetic data set: the DETR of
# detr_r18_synthetic.py with contextual iRPE (product method, piecewise
# index, ratio 1.9 = 7x7 buckets, shared heads, on keys) in every encoder
# self-attention, on top of the sine absolute encoding (paper Tab. 6, #6).
# This is what `make demo` trains and evaluates.
_base_ = './detr_r18_synthetic.py'

model = dict(
    type='iRPEDETR',
    encoder=dict(
        layer_cfg=dict(
            self_attn_cfg=dict(
                rpe_cfg=dict(
                    mode='contextual',
                    method='product',
                    index='piecewise',
                    ratio=1.9,
                    shared_head=True,
                    init='zeros'),  # the paper's init
                rpe_on='k'))))

# No weight decay on the RPE tables, as in the paper.
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'self_attn.rpe_': dict(decay_mult=0.0)}))
