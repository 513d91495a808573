# Conditional DETR-R50 (mmdet's 50-epoch recipe: AdamW 1e-4, backbone x0.1,
# batch 8x2, lr drop at epoch 40) with the point variant of Plain-DETR's
# box-to-pixel relative position bias (Lin et al., ICCV 2023, Sec. 3.2) in
# every decoder cross-attention: Conditional DETR's queries have reference
# points, not boxes, so each axis has one offset (x - px, y - py) to the key
# pixel centres (C5 grid, stride 32), log-scaled ('log8'), through two MLPs
# (1 -> 512 -> 8 heads) per layer. The encoder is mmdet's. A ConditionalDETR
# checkpoint loads with only decoder.box_rpb.* missing.
#   python tools/train.py configs/conditional-detr_point-rpb_r50_50e_coco.py
_base_ = [
    'mmdet::conditional_detr/conditional-detr_r50_8xb2-50e_coco.py',
    './_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

# The decoder's relative position bias (choices in
# mmpe/models/detectors/decoder_pe.py).
model = dict(
    type='PEConditionalDETR',
    decoder_pe=dict(
        type='point-rpb', hidden=512, offsets='log8', stride=32,
        shared=False))
