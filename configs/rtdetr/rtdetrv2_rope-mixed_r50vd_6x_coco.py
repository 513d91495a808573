# RT-DETRv2-L (rtdetrv2_r50vd_6x_coco.py, target 53.4 box AP) with
# RoPE-Mixed (Heo et al., "Rotary Position Embedding for Vision
# Transformer", ECCV 2024, Sec. 3.3: learnable per-head frequencies mixing
# x and y, theta 10) in AIFI, on top of the authors' 2D sin-cos, on
# normalised token coordinates (DINOv3's patch centres in [-1, 1] of each
# image's valid extent, both axes separately): the multi-scale training
# shows AIFI grids of 15 to 25 tokens a side, and normalised coordinates
# give an object's place the same rotation at each of them and at test
# sizes never trained. Everything else is the R50vd 6x recipe. No weight
# decay on the frequencies, as the RoPE-ViT authors (naver-ai/rope-vit:
# `no_weight_decay` returns 'freqs').
#   bash tools/dist_train.sh configs/rtdetr/rtdetrv2_rope-mixed_r50vd_6x_coco.py 4
_base_ = './rtdetrv2_r50vd_6x_coco.py'

model = dict(
    neck=dict(
        encoder_pe=dict(
            absolute='sine',
            relative=dict(
                type='rope-mixed',
                theta=10.,
                rotate=True,
                coords='normalized',
                normalize='separate'))))

optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'rope.freqs': dict(decay_mult=0.)}))
