# DETR-R50 (mmdet's 150-epoch recipe: AdamW 1e-4, backbone x0.1, batch 8x2,
# lr drop at epoch 100) with LookHere (Fuller et al., "LookHere: Vision
# Transformers with Directed Attention Generalize and Extrapolate", NeurIPS
# 2024) in every encoder self-attention, on top of DETR's sine absolute
# encoding; the decoder and its cross-attention keys (sine) unchanged.
# 'corners' (LookHere-90): each of the 8 heads sees one quadrant (up-left,
# up-right, down-left, down-right, twice), the other keys masked, and its
# logits get -slope x the Euclidean distance (the released slopes: 1/2 for
# heads 0-3, 1/4 for heads 4-7; global and layer slopes 1 here). No
# parameters: a DETR checkpoint loads with nothing missing. The twin of
# detr_rope2d_r50_150e_coco.py and detr_irpe_ctx_r50_150e.py.
#   python tools/train.py configs/detr_lookhere_r50_150e_coco.py
#   bash tools/dist_train.sh configs/detr_lookhere_r50_150e_coco.py 8
_base_ = [
    'mmdet::detr/detr_r50_8xb2-150e_coco.py',
    './_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

# The encoder's position encoding, mmpe's one setting (choices in
# mmpe/models/detectors/encoder_pe.py).
model = dict(
    type='PEDETR',
    encoder_pe=dict(
        absolute='sine',
        relative=dict(
            type='lookhere',
            directions='corners',
            distance='linear',
            global_slope=1.0,
            layer_slopes=(1.0, 1.0))))
