"""Positional Encoding Generator (PEG) of CPVT, mask-aware for padded batches.

Reference: Chu et al., "Conditional Positional Encodings for Vision
Transformers", ICLR 2023 (arXiv:2102.10882), Sec. 3 (PEG).
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor

from ....utils.arg_checks import check_int, is_int


@MODELS.register_module()
class PEG(BaseModule):
    """Positional Encoding Generator: a depth-wise conv with zero padding.

    Implements the PEG of CPVT (Sec. 3): the patch tokens are reshaped to
    their ``(h, w)`` grid and ``F(X)`` is a ``k x k`` depth-wise convolution
    with ``k // 2`` zero padding, so the output is ``X + F(X)`` (with a
    residual when ``stride == 1``, as in the authors' ``PosCNN``). The zero
    padding at the border is what lets the convolution infer absolute
    positions.

    **Mask-aware.** In a padded batch the padded tokens are set to zero before
    the convolution, so the zero-padding cue sits at each image's own border
    rather than the border of the batch. Outputs at padded positions are set
    to zero as well, so a padded image yields exactly the unpadded result on
    its valid region, and nothing leaks into the padding.

    Skip tokens (class/distillation tokens, the first ``num_skip`` tokens)
    pass through untouched.

    Args:
        embed_dims (int): Channels C of the tokens.
        kernel_size (int): Odd kernel size k. Defaults to 3.
        stride (int): Stride of the convolution. With ``stride > 1`` there is
            no residual and the output grid is ``ceil(h / stride) x
            ceil(w / stride)`` (see :meth:`output_shape`). Defaults to 1.
        init_cfg (dict, optional): Initialisation config. Defaults to None
            (PyTorch's default conv initialisation, as the authors).
    """

    def __init__(self,
                 embed_dims: int,
                 kernel_size: int = 3,
                 stride: int = 1,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        check_int('embed_dims', embed_dims)
        if not is_int(kernel_size, 1) or kernel_size % 2 == 0:
            raise ValueError(
                f'PEG: `kernel_size` must be a positive odd int (1, 3, 5, '
                f'...) so the padding is symmetric, got {kernel_size!r}')
        check_int('stride', stride)
        self.embed_dims = embed_dims
        self.kernel_size = kernel_size
        self.stride = stride
        self.proj = nn.Conv2d(
            embed_dims,
            embed_dims,
            kernel_size,
            stride=stride,
            padding=kernel_size // 2,
            groups=embed_dims,
            bias=True)

    def output_shape(self, hw_shape: Tuple[int, int]) -> Tuple[int, int]:
        """Grid ``(h', w')`` of the output tokens for an input grid."""
        h, w = hw_shape
        return -(-h // self.stride), -(-w // self.stride)

    def forward(self,
                tokens: Tensor,
                hw_shape: Tuple[int, int],
                padding_mask: Optional[Tensor] = None,
                num_skip: int = 0) -> Tensor:
        """Add the conditional position encoding to the patch tokens.

        Args:
            tokens (Tensor): ``(B, num_skip + h * w, C)``, patch tokens in
                row-major order after ``num_skip`` skip tokens.
            hw_shape (tuple[int, int]): Token grid ``(h, w)``.
            padding_mask (Tensor, optional): ``(B, h, w)`` bool, True where
                the token is padding. Defaults to None (no padding).
            num_skip (int): Leading tokens passed through untouched.
                Defaults to 0.

        Returns:
            Tensor: ``(B, num_skip + h' * w', C)``; ``(h', w') = (h, w)`` for
            ``stride == 1``. Padded positions are zero.
        """
        h, w = hw_shape
        b, n, c = tokens.shape
        if n != num_skip + h * w:
            raise ValueError(
                f'PEG: tokens have length {n} but `num_skip` + h * w = '
                f'{num_skip} + {h} * {w} = {num_skip + h * w}')
        skip, patches = tokens[:, :num_skip], tokens[:, num_skip:]
        # (B, h*w, C) -> (B, C, h, w)
        feat = patches.transpose(1, 2).reshape(b, c, h, w)
        valid = None
        if padding_mask is not None:
            if padding_mask.shape != (b, h, w):
                raise ValueError(
                    f'PEG: `padding_mask` must have shape (B, h, w) = '
                    f'{(b, h, w)}, got {tuple(padding_mask.shape)}')
            # (B, h, w) -> (B, 1, h, w), 1 on real tokens
            valid = (~padding_mask.bool()).unsqueeze(1).to(feat.dtype)
            feat = feat * valid
        out = self.proj(feat)
        if self.stride == 1:
            out = out + feat
        if valid is not None:
            # an output position is real iff its centre input position is
            out = out * valid[:, :, ::self.stride, ::self.stride]
        # (B, C, h', w') -> (B, h'*w', C)
        out = out.flatten(2).transpose(1, 2)
        return torch.cat([skip, out], dim=1) if num_skip else out

