# DAB-DETR-R50, mmdet's 50-epoch recipe, with relative position in both
# places: contextual iRPE in every encoder self-attention (the iRPE paper's
# DETR setting, as dab-detr_irpe-ctx_r50_50e_coco.py) and Plain-DETR's
# box-to-pixel relative position bias (BoxRPB, Lin et al., ICCV 2023) in
# every decoder cross-attention (as dab-detr_box-rpb_r50_50e_coco.py).
#   python tools/train.py configs/dab-detr_irpe-ctx_box-rpb_r50_50e_coco.py
_base_ = ['./dab-detr_irpe-ctx_r50_50e_coco.py']

model = dict(
    decoder_pe=dict(
        type='box-rpb', hidden=512, offsets='log8', stride=32, shared=False))
