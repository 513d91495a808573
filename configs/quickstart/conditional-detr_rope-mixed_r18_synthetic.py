# Quick-start Conditional DETR with RoPE-Mixed (Heo et al., ECCV 2024,
# Sec. 3.3: learnable per-head frequencies mixing x and y, one set per
# encoder layer, theta 10) in every encoder self-attention on top of the sine
# absolute encoding: conditional-detr_irpe_r18_synthetic.py (same model size,
# data, schedule and optimizer) with RoPE-Mixed in place of iRPE. The twin of
# the COCO config conditional-detr_rope-mixed_r50_50e_coco.py.
#   python tools/train.py configs/quickstart/conditional-detr_rope-mixed_r18_synthetic.py
_base_ = './conditional-detr_irpe_r18_synthetic.py'

# 256 dims / 8 heads = 32 channels per head
model = dict(
    encoder_pe=dict(
        relative=dict(_delete_=True, type='rope-mixed', theta=10.,
                      rotate=True)))

# No weight decay on the frequencies, as the RoPE-ViT authors
# (naver-ai/rope-vit: `no_weight_decay` returns 'freqs').
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={'self_attn.rope.freqs': dict(decay_mult=0.0)}))
