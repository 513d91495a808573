# Quick-start DAB-DETR with Plain-DETR's box-to-pixel relative position bias
# (BoxRPB, Lin et al., ICCV 2023) in every decoder cross-attention and no
# relative position in the encoder (sine absolute encoding only): the
# decoder-only twin of dab-detr_irpe_box-rpb_r18_synthetic.py, same model,
# data, schedule and optimizer otherwise.
#   python tools/train.py configs/quickstart/dab-detr_box-rpb_r18_synthetic.py
_base_ = ['./dab-detr_irpe_box-rpb_r18_synthetic.py']

model = dict(encoder_pe=dict(absolute='sine', relative=None))
