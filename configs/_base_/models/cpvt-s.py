# CPVT-Small for the COCO detection configs: ViT-S/16 (DeiT-Small shapes)
# with a PEG after block 0, no class token, ImageNet initialisation from the
# converted DeiT-Small checkpoint, and the AdamW recipe ViT backbones train
# with. The detection configs use them as `{{_base_.cpvt_s_backbone}}` and
# `{{_base_.vit_optim_wrapper}}`; both replace (`_delete_`) what the mmdet
# base configs define. To let the backbone know where each batch is padded,
# set model.type to 'PaddingAwareMaskRCNN' / 'PaddingAwareRetinaNet' /
# 'PaddingAwareDETR' (opt-in: see docs/results.md for what it did in the
# proxy study).
#
# ImageNet initialisation: convert DeiT-Small weights once with
#   wget https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       deit_small_patch16_224-cd65a155.pth checkpoints/cpvt-s_deit-in1k.pth
# To train from scratch instead: --cfg-options model.backbone.init_cfg=None
cpvt_s_backbone = dict(
    _delete_=True,  # the detector base's ResNet-50
    type='CPVT',
    arch='small',
    pos_encoding='peg',  # 'none' | 'learnable' | 'sine' | 'rope2d' | 'irpe'
    peg_positions=(0, ),
    use_cls_token=False,
    out_indices=(-1, ),
    drop_path_rate=0.1,
    init_cfg=dict(
        type='Pretrained', checkpoint='checkpoints/cpvt-s_deit-in1k.pth'))

# no weight decay on norms, biases and position tables
vit_optim_wrapper = dict(
    _delete_=True,  # the base schedule's SGD
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        bias_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.)
        }),
    clip_grad=dict(max_norm=1., norm_type=2))
