# Quick-start DETR-iRPE on the embedded synthetic data set: the DETR of
# detr_r18_synthetic.py with contextual iRPE (product method, piecewise
# index, ratio 1.9 = 7x7 buckets, shared heads, on keys) in every encoder
# self-attention, on top of the sine absolute encoding (paper Tab. 6, #6).
# This is what `make demo` trains and evaluates.
#
# RPE tables: the recipe of the authors' DETR code, as the COCO configs
# (Xavier init, weight decay 1e-4 like every other parameter; sources cited in
# ../_base_/irpe_tables/detr.py). For the paper's ImageNet recipe (zero init,
# no decay on tables), name '../_base_/irpe_tables/imagenet.py' instead.
_base_ = ['./detr_r18_synthetic.py', '../_base_/irpe_tables/detr.py']

model = dict(
    type='PEDETR',
    encoder=dict(
        layer_cfg=dict(
            self_attn_cfg=dict(
                rpe_cfg=dict(
                    mode='contextual',
                    method='product',
                    index='piecewise',
                    ratio=1.9,
                    shared_head=True,
                    init={{_base_.rpe_table_init}}),
                rpe_on='k'))))

# The tables' decay from the recipe (1.0: the base's 1e-4, as the authors).
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={
        'self_attn.rpe_': dict(decay_mult={{_base_.rpe_table_decay_mult}})
    }))
