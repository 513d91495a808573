# DETR-R50 (mmdet's 150-epoch recipe: AdamW 1e-4, backbone x0.1, batch 8x2,
# lr drop at epoch 100) with RoPE-Mixed (Heo et al., "Rotary Position
# Embedding for Vision Transformer", ECCV 2024, Sec. 3.3: learnable per-head
# frequencies mixing x and y, one set per encoder layer, theta 10) in every
# encoder self-attention, on top of DETR's sine absolute encoding; the decoder
# and its cross-attention keys (sine) unchanged. The RoPE twin of
# detr_irpe_ctx_r50_150e.py (iRPE paper Tab. 6, #6). A DETR checkpoint loads
# with only the frequencies (`encoder.layers.*.self_attn.rope.freqs`) missing.
#   python tools/train.py configs/detr_rope-mixed_r50_150e_coco.py
#   bash tools/dist_train.sh configs/detr_rope-mixed_r50_150e_coco.py 8
_base_ = [
    'mmdet::detr/detr_r50_8xb2-150e_coco.py',
    './_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

# The encoder's position encoding, mmpe's one setting (choices in
# mmpe/models/detectors/encoder_pe.py); 256 dims / 8 heads = 32 per head.
model = dict(
    type='PEDETR',
    encoder_pe=dict(absolute='sine', relative=dict(type='rope-mixed', theta=10., rotate=True)))

# No weight decay on the frequencies, as the RoPE-ViT authors
# (naver-ai/rope-vit: `no_weight_decay` returns 'freqs').
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={
            'backbone': dict(lr_mult=0.1, decay_mult=1.0),
            'self_attn.rope.freqs': dict(decay_mult=0.0)
        }))
