# Quick-start Conditional DETR with the point variant of Plain-DETR's
# box-to-pixel relative position bias (Lin et al., ICCV 2023) in every
# decoder cross-attention and no relative position in the encoder (sine
# absolute encoding only): the decoder-only twin of
# conditional-detr_irpe_point-rpb_r18_synthetic.py, same model, data,
# schedule and optimizer otherwise.
#   python tools/train.py configs/quickstart/conditional-detr_point-rpb_r18_synthetic.py
_base_ = ['./conditional-detr_irpe_point-rpb_r18_synthetic.py']

model = dict(encoder_pe=dict(absolute='sine', relative=None))
