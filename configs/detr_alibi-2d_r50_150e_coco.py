# DETR-R50 (mmdet's 150-epoch recipe: AdamW 1e-4, backbone x0.1, batch 8x2,
# lr drop at epoch 100) with 2D ALiBi (CROMA, Fuller et al., NeurIPS 2023:
# ALiBi's per-head slopes, 1/2 ... 1/256 for 8 heads, times the Euclidean
# distance between tokens, subtracted from the logits) in every encoder
# self-attention, on top of DETR's sine absolute encoding; the decoder and
# its cross-attention keys (sine) unchanged. No parameters: a DETR
# checkpoint loads with nothing missing. The twin of
# detr_rope2d_r50_150e_coco.py and detr_irpe_ctx_r50_150e.py.
#   python tools/train.py configs/detr_alibi-2d_r50_150e_coco.py
#   bash tools/dist_train.sh configs/detr_alibi-2d_r50_150e_coco.py 8
_base_ = [
    'mmdet::detr/detr_r50_8xb2-150e_coco.py',
    './_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

# The encoder's position encoding, mmpe's one setting (choices in
# mmpe/models/detectors/encoder_pe.py).
model = dict(
    type='PEDETR',
    encoder_pe=dict(absolute='sine', relative=dict(type='alibi-2d')))
