"""Data samples for a batch of DETR-family neck features: each image's
``img_shape`` and the padded ``batch_input_shape`` in pixels, from the
feature grid ``(h, w)`` of the batch and each image's valid feature size
(bottom/right padding, as mmdet pads)."""
from mmdet.structures import DetDataSample


def feature_samples(feat, img_shapes, stride=8):
    """One ``DetDataSample`` per image of ``feat`` (bs, dim, h, w) whose
    valid feature sizes are ``img_shapes`` [(ih, iw), ...]."""
    h, w = feat.shape[-2:]
    return [
        DetDataSample(
            metainfo=dict(
                img_shape=(ih * stride, iw * stride),
                batch_input_shape=(h * stride, w * stride)))
        for ih, iw in img_shapes
    ]
