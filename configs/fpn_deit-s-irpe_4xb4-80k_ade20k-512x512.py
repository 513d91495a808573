# Semantic FPN with the iRPE authors' DeiT-Small as backbone (class token,
# learnable absolute table resampled from 14 x 14 to each input grid,
# contextual product iRPE on keys in every block, the class token a skip
# token) on ADE20K; everything but the backbone is
# configs/fpn_cpvt-s_4xb4-80k_ade20k-512x512.py (PVT / Twins protocol).
#
# ImageNet initialisation: the authors' released checkpoint, converted once
#   wget https://github.com/wkcn/iRPE-model-zoo/releases/download/1.0/deit_small_patch16_224_ctx_product_50_shared_k.pth
#   python tools/model_converters/deit_irpe_to_mmpe.py \
#       deit_small_patch16_224_ctx_product_50_shared_k.pth \
#       checkpoints/deit_small_patch16_224_ctx_product_50_shared_k_mmpe.pth
# To train from scratch instead: --cfg-options model.backbone.init_cfg=None
_base_ = [
    './fpn_cpvt-s_4xb4-80k_ade20k-512x512.py',
    './_base_/irpe_tables/imagenet.py'
]

model = dict(
    backbone=dict(
        _delete_=True,  # the CPVT-S (PEG) backbone of the base config
        type='CPVT',
        arch='small',
        img_size=224,  # the authors' 14 x 14 table
        patch_size=16,
        pos_encoding=('learnable', 'irpe'),
        use_cls_token=True,  # iRPE skip = 1
        rpe_cfg=dict(
            mode='contextual',
            method='product',
            ratio=1.9,  # 7 x 7 buckets + the class token's
            shared_head=True,
            rpe_on='k',
            init={{_base_.rpe_table_init}}),
        qkv_bias=True,
        norm_cfg=dict(type='LN', eps=1e-6),
        out_indices=(-1, ),
        final_norm=True,
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/'
            'deit_small_patch16_224_ctx_product_50_shared_k_mmpe.pth')))
# iRPE tables: the paper's ImageNet recipe (no decay)
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={
        'attn.rpe_': dict(decay_mult={{_base_.rpe_table_decay_mult}})
    }))
