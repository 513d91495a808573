# Quick-start DETR with 2D ALiBi (CROMA, Fuller et al., NeurIPS 2023:
# per-head slopes times the Euclidean token distance, no parameters) in
# every encoder self-attention on top of the sine absolute encoding: the
# DETR of detr_r18_synthetic.py (same size, data, schedule and optimizer);
# the ALiBi twin of detr_irpe_r18_synthetic.py and of the COCO config
# detr_alibi-2d_r50_150e_coco.py.
#   python tools/train.py configs/quickstart/detr_alibi-2d_r18_synthetic.py
_base_ = './detr_r18_synthetic.py'

model = dict(
    type='PEDETR',
    encoder_pe=dict(absolute='sine', relative=dict(type='alibi-2d')))
