# Quick-start DETR with LookHere (Fuller et al., NeurIPS 2024: each head
# restricted to a quadrant, 'corners', plus a distance penalty per head; no
# parameters) in every encoder self-attention on top of the sine absolute
# encoding: the DETR of detr_r18_synthetic.py (same size, data, schedule and
# optimizer); the LookHere twin of detr_irpe_r18_synthetic.py and of the
# COCO config detr_lookhere_r50_150e_coco.py.
#   python tools/train.py configs/quickstart/detr_lookhere_r18_synthetic.py
_base_ = './detr_r18_synthetic.py'

model = dict(
    type='PEDETR',
    encoder_pe=dict(
        absolute='sine',
        relative=dict(type='lookhere', directions='corners')))
