# Quick-start DETR with Swin-V2's log-spaced continuous position bias (Liu
# et al., CVPR 2022, Sec. 3.3: a 2 -> 512 -> heads MLP of the log-spaced
# offsets, 16 sigmoid) in every encoder self-attention on top of the sine
# absolute encoding: the DETR of detr_r18_synthetic.py (same size, data,
# schedule and optimizer); the log-CPB twin of detr_irpe_r18_synthetic.py
# and of the COCO config detr_log-cpb_r50_150e_coco.py. pretrained_size:
# the largest training grid (128 px at stride 8: 16 x 16).
#   python tools/train.py configs/quickstart/detr_log-cpb_r18_synthetic.py
_base_ = './detr_r18_synthetic.py'

model = dict(
    type='PEDETR',
    encoder_pe=dict(
        absolute='sine',
        relative=dict(type='log-cpb', pretrained_size=(16, 16), hidden=512)))

# No weight decay on the bias MLPs, as Swin-V2 (its no_weight_decay_keywords
# name 'cpb_mlp').
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'cpb_mlp': dict(decay_mult=0.0)}))
