# The quick-start CPVT Mask R-CNN with BackbonePaddingMaskHook: each image
# of a padded batch is seen by the backbone up to its own border (padded
# tokens are not attended to, and the PEG's zero padding starts at the
# image's edge, not at the batch's). Everything else is the same config, so
# the two compare the effect of the batch padding on a ViT detector.
_base_ = './mask-rcnn_cpvt-tiny_synthetic.py'
custom_hooks = [dict(type='BackbonePaddingMaskHook')]
