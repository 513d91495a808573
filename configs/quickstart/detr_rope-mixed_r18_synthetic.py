# Quick-start DETR with RoPE-Mixed (Heo et al., ECCV 2024,
# Sec. 3.3: learnable per-head frequencies mixing x and y, theta 10)
# in every encoder self-attention on top of the sine absolute encoding: the
# DETR of detr_r18_synthetic.py (same size, data, schedule and optimizer);
# the RoPE twin of detr_irpe_r18_synthetic.py (the demo) and of the COCO
# config detr_rope-mixed_r50_150e_coco.py.
#   python tools/train.py configs/quickstart/detr_rope-mixed_r18_synthetic.py
_base_ = './detr_r18_synthetic.py'

# The encoder's position encoding, mmpe's one setting (choices in
# mmpe/models/detectors/encoder_pe.py); 128 dims / 8 heads = 16 per head.
model = dict(
    type='PEDETR',
    encoder_pe=dict(absolute='sine', relative=dict(type='rope-mixed', theta=10., rotate=True)))

# No weight decay on the frequencies, as the RoPE-ViT authors
# (naver-ai/rope-vit: `no_weight_decay` returns 'freqs').
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={'self_attn.rope.freqs': dict(decay_mult=0.0)}))
