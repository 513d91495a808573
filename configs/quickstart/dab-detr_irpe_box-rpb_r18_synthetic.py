# Quick-start DAB-DETR with relative position in encoder and decoder on the
# embedded synthetic data set: dab-detr_irpe_r18_synthetic.py (contextual
# iRPE in every encoder self-attention) plus Plain-DETR's box-to-pixel
# relative position bias (BoxRPB, Lin et al., ICCV 2023) in every decoder
# cross-attention: per layer, MLPs (2 -> 128 -> 8 heads) of the log-scaled
# offsets between the layer's anchor box edges and the key pixel centres of
# the stride-8 grid (ResNet-18 stages 1-2).
#   python tools/train.py configs/quickstart/dab-detr_irpe_box-rpb_r18_synthetic.py
_base_ = ['./dab-detr_irpe_r18_synthetic.py']

model = dict(
    decoder_pe=dict(
        type='box-rpb', hidden=128, offsets='log8', stride=8, shared=False))
