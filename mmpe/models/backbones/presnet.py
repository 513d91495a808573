"""RT-DETR's backbone, PResNet-vd, as mmdet's ResNet-vd plus the one
shortcut in which they differ.

He et al., "Bag of Tricks for Image Classification with Convolutional
Neural Networks" (CVPR 2019), Sec. 4.1 / Fig. 2 (c): ResNet-D, a deep stem
(three 3x3 convs, 32-32-64 channels) and shortcuts that average-pool
before a stride-1 1x1 conv; PaddlePaddle's ResNet-vd, which RT-DETR's
released ``PResNet`` (``rtdetrv2_pytorch/src/nn/backbone/presnet.py``,
``variant='d'``) ports with its ImageNet weights. mmdet's ``ResNetV1d``
(``deep_stem=True, avg_down=True``, style ``'pytorch'``: the stride on the
3x3 conv) is that network with one exception: the first block of every
released stage has a projection shortcut, also where the widths agree
(stage 1 of R18 / R34: a 1x1 conv + BN from 64 to 64 channels, non-zero
in the released weights), and mmdet's has the identity there. R50 / R101
compute the same in both (their stage 1 changes the width). The pooling
agrees: the released ``AvgPool2d(2, 2, 0, ceil_mode=True)`` counts padding
but pads nothing, so an odd edge's windows average their pixels inside, as
mmdet's (``count_include_pad=False``).
"""
import torch.nn as nn
from mmcv.cnn import build_conv_layer, build_norm_layer
from mmdet.models.backbones import ResNetV1d
from mmdet.registry import MODELS


@MODELS.register_module()
class PResNetVd(ResNetV1d):
    """mmdet's ``ResNetV1d`` with a projection shortcut (1x1 conv + norm)
    on the first block of every stage, as the released PResNet-vd.

    Takes ``ResNetV1d``'s arguments; for depth 50 / 101 it is
    ``ResNetV1d``. The released ``freeze_at=k`` is ``frozen_stages=k``
    (``0``: the stem); ``freeze_norm=True`` is ``norm_cfg=dict(type='BN',
    requires_grad=False), norm_eval=True`` (BN in eval mode computes the
    released ``FrozenBatchNorm2d``). Parameter names are mmdet's; the
    mapping of released checkpoints is
    :func:`mmpe.models.utils.rtdetr_encoder_keys.presnet_key`.
    """

    def make_res_layer(self, **kwargs) -> nn.Module:
        """mmdet's stage, its first block given the released projection
        where mmdet leaves the identity."""
        layer = super().make_res_layer(**kwargs)
        first = layer[0]
        if first.downsample is None:
            width = kwargs['planes'] * kwargs['block'].expansion
            # mmdet's layout of a ResNet-vd shortcut, (pool, conv, norm):
            # its stride-1 pool is the identity
            first.downsample = nn.Sequential(
                nn.Identity(),
                build_conv_layer(kwargs.get('conv_cfg'), kwargs['inplanes'],
                                 width, kernel_size=1, bias=False),
                build_norm_layer(kwargs['norm_cfg'], width)[1])
        return layer
