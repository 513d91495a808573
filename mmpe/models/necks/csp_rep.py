"""RT-DETR's fusion blocks: the RepVGG block and the CSP layer built of it.

Ding et al., "RepVGG: Making VGG-style ConvNets Great Again" (CVPR 2021),
Sec. 3.3: a 3x3 conv + BN branch and a 1x1 conv + BN branch summed before
the activation, fused for deployment into one 3x3 conv with bias (each BN
folded into its conv, the 1x1 kernel zero-padded to 3x3 and added). Zhao et
al., "DETRs Beat YOLOs on Real-time Object Detection" (RT-DETR, CVPR 2024),
Fig. 4: the CCFM's fusion block is a CSP layer (two 1x1 branches, RepVGG
blocks on one) whose output is a 1x1 conv of their sum. Both as released in
``rtdetrv2_pytorch/src/zoo/rtdetr/hybrid_encoder.py`` (``RepVggBlock``,
``CSPRepLayer``; RepVGG's identity branch is not used there).
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule, build_activation_layer
from mmengine.model import BaseModule
from torch import Tensor

from ...utils.arg_checks import check_int


class RepVGGBlock(BaseModule):
    """``act(BN(conv3x3(x)) + BN(conv1x1(x)))``; after
    :meth:`switch_to_deploy`, ``act(conv(x))`` with the one fused 3x3 conv.

    Args:
        in_channels (int): Input channels.
        out_channels (int): Output channels.
        norm_cfg (dict): Norm of both branches. Defaults to BN.
        act_cfg (dict, optional): Activation after the sum; None for none.
            Defaults to ReLU (RT-DETR's neck passes SiLU).
        init_cfg (dict, optional): Initialisation config.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 norm_cfg: Dict = dict(type='BN'),
                 act_cfg: Optional[Dict] = dict(type='ReLU'),
                 init_cfg: Optional[Dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.conv1 = ConvModule(
            in_channels, out_channels, 3, padding=1, norm_cfg=norm_cfg,
            act_cfg=None)
        self.conv2 = ConvModule(
            in_channels, out_channels, 1, padding=0, norm_cfg=norm_cfg,
            act_cfg=None)
        self.act = build_activation_layer(act_cfg) if act_cfg else \
            nn.Identity()
        self.deployed = False

    def forward(self, x: Tensor) -> Tensor:
        """(B, C_in, H, W) -> (B, C_out, H, W)."""
        if self.deployed:
            return self.act(self.conv(x))
        return self.act(self.conv1(x) + self.conv2(x))

    def equivalent_kernel_bias(self) -> Tuple[Tensor, Tensor]:
        """The 3x3 kernel and bias of both branches with their BNs folded
        in (the BNs' running statistics: the eval-mode block)."""
        kernel3, bias3 = _fold_bn(self.conv1)
        kernel1, bias1 = _fold_bn(self.conv2)
        return kernel3 + F.pad(kernel1, [1, 1, 1, 1]), bias3 + bias1

    @torch.no_grad()
    def switch_to_deploy(self) -> None:
        """Fuse the two branches into one 3x3 conv with bias, in place (the
        branches are removed; the block then computes its eval-mode output
        with one conv). Calling it again does nothing."""
        if self.deployed:
            return
        kernel, bias = self.equivalent_kernel_bias()
        conv = nn.Conv2d(
            self.in_channels, self.out_channels, 3, padding=1, bias=True)
        conv.to(device=kernel.device, dtype=kernel.dtype)
        conv.weight.copy_(kernel)
        conv.bias.copy_(bias)
        self.conv = conv
        del self.conv1, self.conv2
        self.deployed = True


def _fold_bn(branch: ConvModule) -> Tuple[Tensor, Tensor]:
    """A conv + BN branch as one kernel and bias: ``W * g / s`` and
    ``b - m * g / s`` with ``s = sqrt(var + eps)``."""
    norm = branch.bn
    std = (norm.running_var + norm.eps).sqrt()
    scale = norm.weight / std
    kernel = branch.conv.weight * scale.reshape(-1, 1, 1, 1)
    bias = norm.bias - norm.running_mean * scale
    if branch.conv.bias is not None:
        bias = bias + branch.conv.bias * scale
    return kernel, bias


class CSPRepLayer(BaseModule):
    """``conv3(blocks(conv1(x)) + conv2(x))``: two 1x1 conv + BN + act
    branches of ``int(out_channels * expansion)`` channels, ``num_blocks``
    :class:`RepVGGBlock` on the first, and a 1x1 conv + BN + act to
    ``out_channels`` (the identity when the widths agree).

    Args:
        in_channels (int): Input channels.
        out_channels (int): Output channels.
        num_blocks (int): RepVGG blocks. Defaults to 3.
        expansion (float): Hidden width over ``out_channels``. Defaults
            to 1.
        norm_cfg (dict): Norm of every conv. Defaults to BN.
        act_cfg (dict): Activation of every conv and block. Defaults to
            SiLU.
        init_cfg (dict, optional): Initialisation config.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 num_blocks: int = 3,
                 expansion: float = 1.0,
                 norm_cfg: Dict = dict(type='BN'),
                 act_cfg: Dict = dict(type='SiLU'),
                 init_cfg: Optional[Dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        check_int('num_blocks', num_blocks, minimum=0)
        hidden = int(out_channels * expansion)
        if hidden < 1:
            raise ValueError(
                f'`expansion` {expansion} leaves {hidden} hidden channels '
                f'of {out_channels}; please give a larger expansion')
        self.conv1 = ConvModule(
            in_channels, hidden, 1, norm_cfg=norm_cfg, act_cfg=act_cfg)
        self.conv2 = ConvModule(
            in_channels, hidden, 1, norm_cfg=norm_cfg, act_cfg=act_cfg)
        self.bottlenecks = nn.Sequential(*[
            RepVGGBlock(hidden, hidden, norm_cfg=norm_cfg, act_cfg=act_cfg)
            for _ in range(num_blocks)
        ])
        self.conv3 = nn.Identity() if hidden == out_channels else \
            ConvModule(hidden, out_channels, 1, norm_cfg=norm_cfg,
                       act_cfg=act_cfg)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C_in, H, W) -> (B, C_out, H, W)."""
        return self.conv3(self.bottlenecks(self.conv1(x)) + self.conv2(x))
