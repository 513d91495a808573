# DETR with a CPVT-Small backbone (PEG after block 0, GAP, no class token),
# mmdet's DETR 150-epoch recipe. The stride-16 map is max-pooled to stride
# 32 (as ResNet's C5) and projected to 256 channels for the transformer.
# The backbone loads DeiT-Small weights converted by
# tools/model_converters/timm_vit_to_cpvt.py (see _base_/models/cpvt-s.py).
_base_ = [
    'mmdet::detr/detr_r50_8xb2-150e_coco.py',
    '_base_/models/cpvt-s.py',
    './_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)
default_scope = 'mmdet'

model = dict(
    backbone={{_base_.cpvt_s_backbone}},
    neck=dict(
        _delete_=True,
        type='ViTSimpleFPN',
        in_channels=384,
        out_channels=256,
        scale_factors=(0.5, ),  # one stride-32 level, as DETR's C5
        num_outs=1))
# The base recipe keeps AdamW(lr 1e-4, wd 1e-4), backbone lr x 0.1 and
# grad-norm clipping at 0.1.
