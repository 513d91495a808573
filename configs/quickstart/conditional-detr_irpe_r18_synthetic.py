# Quick-start Conditional DETR with iRPE on the embedded synthetic data set:
# the tiny DETR of detr_r18_synthetic.py (half-width ResNet-18 stages 1-2,
# 3 + 3 layers, FFN 512, 10 queries, same data, schedule and optimizer) with
# mmdet's Conditional DETR decoder and head (conditional cross-attention,
# sigmoid focal loss), and contextual iRPE (product method, piecewise index,
# ratio 1.9 = 7x7 buckets, shared heads, on keys) in every encoder
# self-attention on top of the sine absolute encoding, as the iRPE paper's
# DETR setting (Tab. 6, #6). The twin of detr_irpe_r18_synthetic.py.
#   python tools/train.py configs/quickstart/conditional-detr_irpe_r18_synthetic.py
#   make demo-fast      (the same, then tools/test.py: the README's second demo)
#
# Schedule: 12 epochs, lr x0.1 at 10 -- the training compute of the DETR
# demo's 20 epochs (drop at 16): this model's step costs 0.68 s against DETR-
# iRPE's 0.41 s (batch 8, 1 thread), so 20 x 0.41 / 0.68 = 12 epochs.
#
# RPE tables: the recipe of the authors' DETR code (Xavier init, weight decay
# 1e-4 like every other parameter; sources in ../_base_/irpe_tables/detr.py).
_base_ = ['./detr_r18_synthetic.py', '../_base_/irpe_tables/detr.py']

# 256 dims, not the DETR twin's 128: mmdet 3.3's
# ConditionalDetrTransformerDecoder encodes the reference points with a fixed
# 128-feature sine per coordinate (2 x 128 = 256 channels) whatever the
# model's width. The FFN keeps the DETR twin's 512 channels.
embed_dims = 256
ffn_cfg = dict(embed_dims=embed_dims, feedforward_channels=512)
model = dict(
    type='PEConditionalDETR',
    neck=dict(out_channels=embed_dims),
    positional_encoding=dict(num_feats=embed_dims // 2),
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
            ffn_cfg=ffn_cfg,
            self_attn_cfg=dict(embed_dims=embed_dims))),
    # mmdet's conditional-detr_r50_8xb2-50e_coco.py decoder, at this size
    decoder=dict(
        layer_cfg=dict(
            self_attn_cfg=dict(
                _delete_=True,
                embed_dims=embed_dims,
                num_heads=8,
                attn_drop=0.0,
                cross_attn=False),
            cross_attn_cfg=dict(
                _delete_=True,
                embed_dims=embed_dims,
                num_heads=8,
                attn_drop=0.0,
                cross_attn=True),
            ffn_cfg=ffn_cfg)),
    bbox_head=dict(
        type='ConditionalDETRHead',
        embed_dims=embed_dims,
        loss_cls=dict(
            _delete_=True,
            type='FocalLoss',
            use_sigmoid=True,
            gamma=2.0,
            alpha=0.25,
            loss_weight=2.0)),
    train_cfg=dict(
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                dict(type='FocalLossCost', weight=2.0),
                dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                dict(type='IoUCost', iou_mode='giou', weight=2.0)
            ])))

# The tables' decay from the recipe (1.0: the base's 1e-4, as the authors).
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={
        'self_attn.rpe_': dict(decay_mult={{_base_.rpe_table_decay_mult}})
    }))

# 12 epochs = the DETR demo's compute (header); validation every 2 epochs
max_epochs = 12
train_cfg = dict(max_epochs=max_epochs, val_interval=2)
param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[10],
        gamma=0.1)
]
default_hooks = dict(checkpoint=dict(interval=2))
