# DETR-R50 (mmdet's 150-epoch recipe: AdamW 1e-4, backbone x0.1, batch 8x2,
# lr drop at epoch 100) with axial 2D RoPE (Heo et al., "Rotary Position
# Embedding for Vision Transformer", ECCV 2024, Eq. 10-11: half of each head's
# channels rotate with the column, half with the row; fixed frequencies, theta
# 100) in every encoder self-attention, on top of DETR's sine absolute
# encoding; the decoder and its cross-attention keys (sine) unchanged. The
# RoPE twin of detr_irpe_ctx_r50_150e.py (iRPE paper Tab. 6, #6). A DETR
# checkpoint loads with nothing missing (RoPE-2D has no parameters).
#   python tools/train.py configs/detr_rope2d_r50_150e_coco.py
#   bash tools/dist_train.sh configs/detr_rope2d_r50_150e_coco.py 8
_base_ = [
    'mmdet::detr/detr_r50_8xb2-150e_coco.py',
    './_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

# The encoder's position encoding, mmpe's one setting (choices in
# mmpe/models/detectors/encoder_pe.py); 256 dims / 8 heads = 32 per head.
model = dict(
    type='PEDETR',
    encoder_pe=dict(absolute='sine', relative=dict(type='rope2d', theta=100.)))
