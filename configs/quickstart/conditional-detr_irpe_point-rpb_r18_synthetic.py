# Quick-start Conditional DETR with relative position in encoder and decoder
# on the embedded synthetic data set: conditional-detr_irpe_r18_synthetic.py
# (contextual iRPE in every encoder self-attention) plus the point variant
# of Plain-DETR's box-to-pixel relative position bias (Lin et al., ICCV
# 2023) in every decoder cross-attention: Conditional DETR's reference
# points give one offset per axis (x - px, y - py) to the key pixel centres
# of the stride-8 grid, log-scaled, through per-layer MLPs
# (1 -> 128 -> 8 heads).
#   python tools/train.py configs/quickstart/conditional-detr_irpe_point-rpb_r18_synthetic.py
_base_ = ['./conditional-detr_irpe_r18_synthetic.py']

model = dict(
    decoder_pe=dict(
        type='point-rpb', hidden=128, offsets='log8', stride=8,
        shared=False))
