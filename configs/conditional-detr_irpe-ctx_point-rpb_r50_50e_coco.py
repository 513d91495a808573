# Conditional DETR-R50, mmdet's 50-epoch recipe, with relative position in
# both places: contextual iRPE in every encoder self-attention (as
# conditional-detr_irpe-ctx_r50_50e_coco.py) and the point variant of
# Plain-DETR's box-to-pixel relative position bias in every decoder
# cross-attention (as conditional-detr_point-rpb_r50_50e_coco.py).
#   python tools/train.py configs/conditional-detr_irpe-ctx_point-rpb_r50_50e_coco.py
_base_ = ['./conditional-detr_irpe-ctx_r50_50e_coco.py']

model = dict(
    decoder_pe=dict(
        type='point-rpb', hidden=512, offsets='log8', stride=32,
        shared=False))
