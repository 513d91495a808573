# Quick-start: Mask R-CNN with a tiny DeiT-iRPE backbone -- the layout of the
# iRPE authors' DeiT-with-iRPE (class token, learnable absolute table AND
# contextual product iRPE on keys in every block, the class token a skip
# token) -- randomly initialised, on the embedded synthetic instance set,
# evaluated with COCO bbox and segm AP. Everything but the backbone is
# configs/quickstart/mask-rcnn_cpvt-tiny_synthetic.py (same data, neck,
# heads, 4 epochs and schedule), so the two compare position encodings.
#   python tools/dataset_converters/make_synthetic_coco.py
#   python tools/train.py configs/quickstart/mask-rcnn_deit-tiny-irpe_synthetic.py
#
# Smaller than DeiT-Ti for speed (128 dims, 4 blocks, 4 heads, 16 x 16
# patches) as the CPVT twin. The COCO version with the authors' ImageNet
# weights is configs/mask-rcnn_deit-s-irpe_fpn_1x_coco.py.
_base_ = [
    './mask-rcnn_cpvt-tiny_synthetic.py', '../_base_/irpe_tables/imagenet.py'
]

embed_dims = 128
model = dict(
    backbone=dict(
        _delete_=True,  # the CPVT (PEG) backbone of the base config
        type='CPVT',
        arch=dict(embed_dims=embed_dims, depth=4, num_heads=4, mlp_ratio=4.),
        img_size=256,  # grid of the absolute table, resampled to each input
        patch_size=16,
        pos_encoding=('learnable', 'irpe'),
        use_cls_token=True,  # iRPE skip = 1
        rpe_cfg=dict(
            mode='contextual',
            method='product',
            ratio=1.9,  # 7 x 7 buckets + the class token's
            shared_head=True,
            rpe_on='k',
            init={{_base_.rpe_table_init}}),
        qkv_bias=True,
        norm_cfg=dict(type='LN', eps=1e-6),
        out_indices=(-1, ),
        final_norm=True,
        init_cfg=None),
    neck=dict(in_channels=embed_dims))
# no weight decay on the absolute table and the class token (as DeiT), and
# the paper's ImageNet recipe for the iRPE tables (_base_/irpe_tables/
# imagenet.py: zero init, no decay)
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
            'attn.rpe_': dict(decay_mult={{_base_.rpe_table_decay_mult}})
        }))
