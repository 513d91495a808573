# Conditional DETR-R50 (mmdet's 50-epoch recipe: AdamW 1e-4, backbone x0.1,
# batch 8x2, lr drop at epoch 40) with the iRPE paper's DETR setting (Tab. 6,
# #6) in its encoder: sine absolute encoding plus contextual iRPE (product
# method, piecewise index, ratio 1.9 = 7x7 buckets, tables shared across
# heads, on keys) in every encoder self-attention layer; the conditional
# decoder unchanged. A ConditionalDETR checkpoint loads with only the RPE
# tables missing.
#   python tools/train.py configs/conditional-detr_irpe-ctx_r50_50e_coco.py
#   bash tools/dist_train.sh configs/conditional-detr_irpe-ctx_r50_50e_coco.py 8
#
# RPE tables: the recipe of the authors' DETR code (Xavier init, weight decay
# 1e-4 like every other parameter; sources in _base_/irpe_tables/detr.py).
# The paper's ImageNet recipe (zero init, no decay on tables) is one line
# away: '_base_/irpe_tables/imagenet.py' instead of '.../detr.py'.
_base_ = [
    'mmdet::conditional_detr/conditional-detr_r50_8xb2-50e_coco.py',
    './_base_/irpe_tables/detr.py',
    './_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

# The encoder's position encoding, mmpe's one setting (choices in
# mmpe/models/detectors/encoder_pe.py): mmdet's sine plus contextual iRPE.
model = dict(
    type='PEConditionalDETR',
    encoder_pe=dict(
        absolute='sine',
        relative=dict(
            type='irpe',
            mode='contextual',
            method='product',
            index='piecewise',
            ratio=1.9,
            shared_head=True,
            init={{_base_.rpe_table_init}},
            on='k')))

# The tables' decay from the recipe (1.0: the base's 1e-4, as the authors).
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={
            'backbone': dict(lr_mult=0.1, decay_mult=1.0),
            'self_attn.rpe_': dict(decay_mult={{_base_.rpe_table_decay_mult}})
        }))
