# Mask R-CNN with a CPVT-Small backbone (PEG after block 0, GAP, no class
# token) and a ViTDet simple feature pyramid (strides 4-64), COCO 1x
# schedule; evaluated with COCO bbox and segm AP.
# The backbone loads DeiT-Small weights converted by
# tools/model_converters/timm_vit_to_cpvt.py (see _base_/models/cpvt-s.py).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
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
        scale_factors=(4.0, 2.0, 1.0, 0.5),  # strides 4, 8, 16, 32
        num_outs=5,  # + stride 64 by max-pooling, as FPN's P6
        extra_type='maxpool'))
optim_wrapper = {{_base_.vit_optim_wrapper}}
auto_scale_lr = dict(enable=False, base_batch_size=16)
