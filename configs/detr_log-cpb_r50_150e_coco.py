# DETR-R50 (mmdet's 150-epoch recipe: AdamW 1e-4, backbone x0.1, batch 8x2,
# lr drop at epoch 100) with Swin-V2's log-spaced continuous position bias
# (Liu et al., "Swin Transformer V2", CVPR 2022, Sec. 3.3) in every encoder
# self-attention, on top of DETR's sine absolute encoding; the decoder and
# its cross-attention keys (sine) unchanged. Each layer's MLP (2 -> 512 ->
# 8 heads) maps the log-spaced offsets sign(d) log2(1 + |8 d / 41|) / log2(8)
# of the batch's feature grid to 16 sigmoid(.) per head, so a larger test
# grid gets new offsets, not an interpolated table. pretrained_size: the
# longest training side at stride 32 (1333 / 32 = 42) on both axes, so
# every training offset lies in Swin-V2's [-8, 8] before the log.
# The twin of detr_rope2d_r50_150e_coco.py and detr_irpe_ctx_r50_150e.py.
#   python tools/train.py configs/detr_log-cpb_r50_150e_coco.py
#   bash tools/dist_train.sh configs/detr_log-cpb_r50_150e_coco.py 8
_base_ = [
    'mmdet::detr/detr_r50_8xb2-150e_coco.py',
    './_base_/runtime_mmpe.py',
]
custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)

# The encoder's position encoding, mmpe's one setting (choices in
# mmpe/models/detectors/encoder_pe.py).
model = dict(
    type='PEDETR',
    encoder_pe=dict(
        absolute='sine',
        relative=dict(type='log-cpb', pretrained_size=(42, 42), hidden=512)))

# No weight decay on the bias MLPs, as Swin-V2 (its no_weight_decay_keywords
# name 'cpb_mlp').
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'cpb_mlp': dict(decay_mult=0.0)}))
