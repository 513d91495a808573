# The peer of configs/quickstart/fpn_cpvt-tiny_synthetic-seg.py in the
# segmentation resolution study: mmseg's own Twins-PCPVT (Chu et al. 2021,
# "Twins"; a pyramid ViT whose position encoding is CPVT's PEG after the
# first block of each stage) at about the tiny CPVT's size, with everything
# else the same (data, crops, Semantic FPN head, schedule). Its four stages
# give strides 4-32 directly, so mmseg's FPN neck (64 channels) replaces the
# simple pyramid. PCPVT takes no padding mask: the plain EncoderDecoder.
#   python tools/train.py configs/quickstart/fpn_pcpvt-tiny_synthetic-seg.py
_base_ = ['./fpn_cpvt-tiny_synthetic-seg.py']

# 0.90 M backbone parameters (the tiny CPVT: 0.89 M); 1.33 M in all (1.40 M)
embed_dims = [32, 64, 96, 160]
model = dict(
    type='EncoderDecoder',
    backbone=dict(
        _delete_=True,
        type='PCPVT',
        in_channels=3,
        embed_dims=embed_dims,
        patch_sizes=[4, 2, 2, 2],
        strides=[4, 2, 2, 2],
        num_heads=[1, 2, 3, 4],
        mlp_ratios=[4, 4, 4, 4],
        depths=[1, 1, 2, 1],
        sr_ratios=[8, 4, 2, 1],
        qkv_bias=True,
        norm_after_stage=False,
        drop_path_rate=0.,
        init_cfg=None),
    neck=dict(
        _delete_=True,
        type='FPN',
        in_channels=embed_dims,
        out_channels={{_base_.channels}},
        num_outs=4))
