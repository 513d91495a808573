# Conditional DETR-R50 (mmdet's 50-epoch recipe: AdamW 1e-4, backbone x0.1,
# batch 8x2, lr drop at epoch 40) with RoPE-Mixed (Heo et al., "Rotary
# Position Embedding for Vision Transformer", ECCV 2024, Sec. 3.3: learnable
# per-head frequencies mixing x and y, one set per encoder layer) in every
# encoder self-attention, on top of mmdet's sine absolute encoding. The
# conditional decoder and its cross-attention keys (sine) are unchanged. A
# ConditionalDETR checkpoint loads with only the frequencies
# (`encoder.layers.*.self_attn.rope.freqs`) missing.
#   python tools/train.py configs/conditional-detr_rope-mixed_r50_50e_coco.py
#   bash tools/dist_train.sh configs/conditional-detr_rope-mixed_r50_50e_coco.py 8
_base_ = [
    'mmdet::conditional_detr/conditional-detr_r50_8xb2-50e_coco.py',
    './_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

# The encoder's position encoding, mmpe's one setting (choices in
# mmpe/models/detectors/encoder_pe.py). theta 10: the authors' RoPE-Mixed
# frequency base; 256 dims / 8 heads = 32 channels per head.
model = dict(
    type='PEConditionalDETR',
    encoder_pe=dict(
        absolute='sine',
        relative=dict(type='rope-mixed', theta=10., rotate=True)))

# No weight decay on the frequencies, as the RoPE-ViT authors
# (naver-ai/rope-vit: `no_weight_decay` returns 'freqs').
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={
            'backbone': dict(lr_mult=0.1, decay_mult=1.0),
            'self_attn.rope.freqs': dict(decay_mult=0.0)
        }))
