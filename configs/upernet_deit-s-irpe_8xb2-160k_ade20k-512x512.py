# UperNet with the iRPE authors' DeiT-Small (learnable table + contextual
# product iRPE on keys, class token as skip token) on ADE20K; everything but
# the backbone is configs/upernet_cpvt-s_8xb2-160k_ade20k-512x512.py (Swin
# protocol). ImageNet initialisation: the converted authors' checkpoint, as
# configs/fpn_deit-s-irpe_4xb4-80k_ade20k-512x512.py says
# (checkpoints/deit_small_patch16_224_ctx_product_50_shared_k_mmpe.pth).
_base_ = [
    './upernet_cpvt-s_8xb2-160k_ade20k-512x512.py',
    './_base_/irpe_tables/imagenet.py'
]

model = dict(
    backbone=dict(
        _delete_=True,  # the CPVT-S (PEG) backbone of the base config
        type='CPVT',
        arch='small',
        img_size=224,
        patch_size=16,
        pos_encoding=('learnable', 'irpe'),
        use_cls_token=True,
        rpe_cfg=dict(
            mode='contextual',
            method='product',
            ratio=1.9,
            shared_head=True,
            rpe_on='k',
            init={{_base_.rpe_table_init}}),
        qkv_bias=True,
        norm_cfg=dict(type='LN', eps=1e-6),
        out_indices=(3, 5, 7, 11),
        final_norm=True,
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/'
            'deit_small_patch16_224_ctx_product_50_shared_k_mmpe.pth')))
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={
        'attn.rpe_': dict(decay_mult={{_base_.rpe_table_decay_mult}})
    }))
