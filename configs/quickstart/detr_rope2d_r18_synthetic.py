# Quick-start DETR with axial 2D RoPE (Heo et al., ECCV 2024,
# Eq. 10-11: fixed frequencies, theta 100)
# in every encoder self-attention on top of the sine absolute encoding: the
# DETR of detr_r18_synthetic.py (same size, data, schedule and optimizer);
# the RoPE twin of detr_irpe_r18_synthetic.py (the demo) and of the COCO
# config detr_rope2d_r50_150e_coco.py.
#   python tools/train.py configs/quickstart/detr_rope2d_r18_synthetic.py
_base_ = './detr_r18_synthetic.py'

# The encoder's position encoding, mmpe's one setting (choices in
# mmpe/models/detectors/encoder_pe.py); 128 dims / 8 heads = 16 per head.
model = dict(
    type='PEDETR',
    encoder_pe=dict(absolute='sine', relative=dict(type='rope2d', theta=100.)))
