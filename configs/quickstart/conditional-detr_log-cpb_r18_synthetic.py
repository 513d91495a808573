# Quick-start Conditional DETR with Swin-V2's log-spaced continuous position
# bias (Liu et al., CVPR 2022, Sec. 3.3) in every encoder self-attention on
# top of the sine absolute encoding: conditional-detr_irpe_r18_synthetic.py
# (same model size, data, schedule and optimizer) with log-CPB in place of
# iRPE; the twin of detr_log-cpb_r18_synthetic.py. pretrained_size: the
# largest training grid (128 px at stride 8: 16 x 16). 2D ALiBi and LookHere
# are one option away: --cfg-options model.encoder_pe.relative=alibi-2d
# (or =lookhere, its 'corners' default).
#   python tools/train.py configs/quickstart/conditional-detr_log-cpb_r18_synthetic.py
_base_ = './conditional-detr_irpe_r18_synthetic.py'

model = dict(
    encoder_pe=dict(
        relative=dict(_delete_=True, type='log-cpb', pretrained_size=(16, 16),
                      hidden=512)))

# No weight decay on the bias MLPs, as Swin-V2 (its no_weight_decay_keywords
# name 'cpb_mlp').
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'cpb_mlp': dict(decay_mult=0.0)}))
