# Quick-start DAB-DETR with iRPE on the embedded synthetic data set: the tiny
# DETR of detr_r18_synthetic.py (half-width ResNet-18 stages 1-2, 128 dims,
# 3 + 3 layers, 10 queries, same data, schedule and optimizer) with mmdet's
# DAB-DETR encoder (sine encoding scaled per token), anchor-box decoder and
# head (sigmoid focal loss), and contextual iRPE (product method, piecewise
# index, ratio 1.9 = 7x7 buckets, shared heads, on keys) in every encoder
# self-attention, as the iRPE paper's DETR setting (Tab. 6, #6). The twin of
# detr_irpe_r18_synthetic.py.
#   python tools/train.py configs/quickstart/dab-detr_irpe_r18_synthetic.py
#
# RPE tables: the recipe of the authors' DETR code (Xavier init, weight decay
# 1e-4 like every other parameter; sources in ../_base_/irpe_tables/detr.py).
_base_ = ['./detr_r18_synthetic.py', '../_base_/irpe_tables/detr.py']

embed_dims = 128
# mmdet's dab-detr_r50_8xb2-50e_coco.py model, at this size
ffn_cfg = dict(
    embed_dims=embed_dims,
    feedforward_channels=4 * embed_dims,
    num_fcs=2,
    ffn_drop=0.0,
    act_cfg=dict(_delete_=True, type='PReLU'))
model = dict(
    type='PEDABDETR',
    with_random_refpoints=False,
    num_patterns=0,
    # the encoder's position encoding (mmpe's one setting, see
    # mmpe/models/detectors/encoder_pe.py): mmdet's sine plus contextual iRPE
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
            on='k')),
    encoder=dict(
        layer_cfg=dict(
            ffn_cfg=ffn_cfg)),
    decoder=dict(
        query_dim=4,
        query_scale_type='cond_elewise',
        with_modulated_hw_attn=True,
        layer_cfg=dict(
            self_attn_cfg=dict(
                _delete_=True,
                embed_dims=embed_dims,
                num_heads=8,
                attn_drop=0.0,
                proj_drop=0.0,
                cross_attn=False),
            cross_attn_cfg=dict(
                _delete_=True,
                embed_dims=embed_dims,
                num_heads=8,
                attn_drop=0.0,
                proj_drop=0.0,
                cross_attn=True),
            ffn_cfg=ffn_cfg)),
    positional_encoding=dict(
        num_feats=embed_dims // 2, temperature=20, normalize=True),
    bbox_head=dict(
        type='DABDETRHead',
        loss_cls=dict(
            _delete_=True,
            type='FocalLoss',
            use_sigmoid=True,
            gamma=2.0,
            alpha=0.25,
            loss_weight=1.0)),
    train_cfg=dict(
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                dict(type='FocalLossCost', weight=2., eps=1e-8),
                dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                dict(type='IoUCost', iou_mode='giou', weight=2.0)
            ])))

# The tables' decay from the recipe (1.0: the base's 1e-4, as the authors).
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={
        'self_attn.rpe_': dict(decay_mult={{_base_.rpe_table_decay_mult}})
    }))
