# DAB-DETR-R50 (mmdet's 50-epoch recipe: AdamW 1e-4, backbone x0.1, batch
# 8x2, lr drop at epoch 40) with Plain-DETR's box-to-pixel relative position
# bias (BoxRPB; Lin et al., ICCV 2023, Sec. 3.2) in every decoder
# cross-attention: per layer, two MLPs (2 -> 512 -> 8 heads) of the offsets
# between the layer's anchor box edges and the key pixel centres (C5 grid,
# stride 32), log-scaled ('log8'). The encoder is mmdet's
# (sine absolute encoding, no relative one). A DABDETR checkpoint loads with
# only decoder.box_rpb.* missing.
#   python tools/train.py configs/dab-detr_box-rpb_r50_50e_coco.py
#   bash tools/dist_train.sh configs/dab-detr_box-rpb_r50_50e_coco.py 8
_base_ = [
    'mmdet::dab_detr/dab-detr_r50_8xb2-50e_coco.py',
    './_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

# The decoder's relative position bias (choices in
# mmpe/models/detectors/decoder_pe.py).
model = dict(
    type='PEDABDETR',
    decoder_pe=dict(
        type='box-rpb', hidden=512, offsets='log8', stride=32, shared=False))
