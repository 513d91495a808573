# Mask R-CNN with the iRPE authors' DeiT-Small as backbone (class token,
# learnable absolute table resampled from 14 x 14 to each input grid, and
# contextual product iRPE on keys in every block, the class token a skip
# token with its own bucket), ViTDet simple feature pyramid (strides 4-64),
# COCO 1x schedule; evaluated with COCO bbox and segm AP. Everything but the
# backbone is configs/mask-rcnn_cpvt-s_fpn_1x_coco.py.
#
# ImageNet initialisation: the authors' released checkpoint (80.9 top-1, their
# number), converted once with
#   wget https://github.com/wkcn/iRPE-model-zoo/releases/download/1.0/deit_small_patch16_224_ctx_product_50_shared_k.pth
#   python tools/model_converters/deit_irpe_to_mmpe.py \
#       deit_small_patch16_224_ctx_product_50_shared_k.pth \
#       checkpoints/deit_small_patch16_224_ctx_product_50_shared_k_mmpe.pth
# The converter prints the CPVT config matching the file (below for _k). For
# their _qk / _qkv checkpoints convert those files, set rpe_cfg.rpe_on to
# 'qk' / 'qkv' and point init_cfg to the converted file.
# To train from scratch instead: --cfg-options model.backbone.init_cfg=None
_base_ = [
    './mask-rcnn_cpvt-s_fpn_1x_coco.py', './_base_/irpe_tables/imagenet.py'
]

model = dict(
    backbone=dict(
        _delete_=True,  # the CPVT-S (PEG) backbone of the base config
        type='CPVT',
        arch='small',  # DeiT-S: 384 dims, 12 blocks, 6 heads, MLP ratio 4
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
# as the base: no decay on norms, biases, the absolute table and the class
# token; the iRPE tables follow the paper's ImageNet recipe, under which the
# authors trained them (_base_/irpe_tables/imagenet.py: no decay; zero init
# when trained from scratch)
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={
        'attn.rpe_': dict(decay_mult={{_base_.rpe_table_decay_mult}})
    }))
