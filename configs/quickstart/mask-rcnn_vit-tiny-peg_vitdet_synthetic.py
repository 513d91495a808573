# Quick-start twin of the ViTDet configs (configs/mask-rcnn_vit-*_vitdet_*):
# the tiny CPVT Mask R-CNN of mask-rcnn_cpvt-tiny_synthetic.py (128 dims,
# 4 blocks, 4 heads, PEG after block 0, simple feature pyramid, same heads,
# data, 4 epochs and optimiser) with ViTDet's layout: attention inside
# non-overlapping 4 x 4 windows (the embedded images are 8-16 patches a side,
# so 2-4 windows, as ViTDet's 14 x 14 windows on a 64 x 64 grid) in blocks
# 0 and 2, global attention in blocks 1 and 3 (ViTDet: 2, 5, 8, 11 of 12),
# and the padding-aware detector (padded tokens are masked keys, as the
# windows' own padding). No pretrained weights; the optimiser is the base's
# (layer-wise lr decay is a fine-tuning recipe: see the COCO configs).
#   python tools/dataset_converters/make_synthetic_coco.py
#   python tools/train.py configs/quickstart/mask-rcnn_vit-tiny-peg_vitdet_synthetic.py
# Swap `pos_encoding` ('none', 'learnable', 'sine', 'rope2d', 'rope-mixed',
# 'irpe', 'rel-pos') or set `window_size=0` (global everywhere) to compare.
_base_ = './mask-rcnn_cpvt-tiny_synthetic.py'

model = dict(
    type='PaddingAwareMaskRCNN',
    backbone=dict(window_size=4, global_blocks=(1, 3)))
