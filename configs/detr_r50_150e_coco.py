# iRPE paper Tab. 6, #1: DETR-R50 with the sine absolute encoding, no RPE.
# This is mmdet's own DETR 150-epoch recipe, kept here so the table's rows
# sit side by side:  python tools/train.py configs/detr_r50_150e_coco.py
_base_ = [
    'mmdet::detr/detr_r50_8xb2-150e_coco.py',
    './_base_/runtime_mmpe.py',
]
# for MMPERunner and the hooks of the runtime base
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)
