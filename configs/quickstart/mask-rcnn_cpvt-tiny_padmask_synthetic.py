# The quick-start CPVT Mask R-CNN told each batch's padding: the detector
# passes a padding mask built from every sample's `img_shape` to the
# backbone, so each image of a padded batch is seen up to its own border
# (padded tokens are not attended to, and the PEG's zero padding starts at
# the image's edge, not at the batch's). Everything else is the same config
# (same state-dict keys too), so the two compare the effect of the batch
# padding on a ViT detector.
_base_ = './mask-rcnn_cpvt-tiny_synthetic.py'
model = dict(type='PaddingAwareMaskRCNN')
