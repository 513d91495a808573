"""The plain ViT's input stage: images to tokens with their position encodings.

Patch embedding (the pixels padded bottom/right to whole patches), the class
token, the absolute encodings (``'learnable'``: a table for the pre-training
grid resampled to each input's grid, also when loading a checkpoint made for
another grid; ``'sine'``), the token padding mask of a pixel mask, and the
rotary tables (``'rope2d'``: one module for all blocks; ``'rope-mixed'``: one
per block) at the batch's RoPE coordinates.

:class:`~mmpe.models.backbones.CPVT` holds these as its own attributes
(state-dict keys ``patch_embed.*``, ``cls_token``, ``register_tokens``,
``pos_embed``,
``ropes.N.freqs``, as timm's ViT), so this is a mixin, not a submodule.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..layers.common.tracing import is_tracing
from ..layers.encodings.pos_embed_2d import (SinCosPosEmbed2D,
                                             resample_pos_embed)
from ..layers.encodings.rope2d import RoPE2D
from ..layers.encodings.rope_coords import RoPECoords, valid_extent
from ..layers.encodings.rope_mixed import RoPEMixed
from ..utils.padding_mask import token_padding_mask


class ViTInputMixin:
    """Patch embedding and position encodings of an ``nn.Module`` ViT.

    The host sets ``embed_dims``, ``num_heads``, ``depth``, ``patch_size``,
    ``num_registers`` (register tokens), ``num_skip`` (the class token, 1 or
    0, plus the registers) and ``pretrain_grid`` (the ``'learnable'``
    table's grid) before calling :meth:`_init_input`. The table has a row
    for the class token, none for the registers (as DINOv2).
    """

    def _init_input(self, in_channels: int, encodings: Tuple[str, ...],
                    sine_temperature: float, rope_args: dict,
                    coord_cfg: Optional[dict], drop_rate: float,
                    resample: dict) -> None:
        """Build the input stage's modules and parameters.

        Args:
            in_channels (int): Image channels.
            encodings (tuple[str]): The parsed ``pos_encoding``.
            sine_temperature (float): Temperature of ``'sine'``.
            rope_args (dict): Arguments of the rotary modules.
            coord_cfg (dict, optional): Arguments of :class:`RoPECoords`
                (None: integer token indices).
            drop_rate (float): Dropout after the position embedding.
            resample (dict): Arguments of ``resample_pos_embed`` for the
                ``'learnable'`` table.
        """
        embed_dims = self.embed_dims
        head_dim = embed_dims // self.num_heads
        self._resample = resample
        self.patch_embed = nn.Conv2d(
            in_channels, embed_dims, self.patch_size, stride=self.patch_size)
        # the class token (and its table row) and the registers (none)
        self.num_cls = self.num_skip - self.num_registers
        self.cls_token = nn.Parameter(torch.zeros(
            1, 1, embed_dims)) if self.num_cls else None
        self.register_tokens = nn.Parameter(torch.zeros(
            1, self.num_registers, embed_dims)) if self.num_registers else None
        self.pos_embed = None
        self.sincos = None
        self.rope = None
        if 'learnable' in encodings:
            num_grid = self.pretrain_grid[0] * self.pretrain_grid[1]
            self.pos_embed = nn.Parameter(
                torch.zeros(1, self.num_cls + num_grid, embed_dims))
        if 'sine' in encodings:
            self.sincos = SinCosPosEmbed2D(embed_dims, sine_temperature)
        if 'rope2d' in encodings:
            self.rope = RoPE2D(head_dim, **rope_args)
        self.ropes = nn.ModuleList(
            RoPEMixed(head_dim, self.num_heads, **rope_args)
            for _ in range(self.depth if 'rope-mixed' in encodings else 0))
        # the RoPE token positions of a batch, made once for all blocks
        # (while augmenting: once per block, CPVT._tokens)
        # (None: integer indices, the rotary modules' own tables)
        self.rope_coords = None
        # the window blocks' own positions (EVA-02's window RoPE; None:
        # the global blocks')
        self.rope_coords_window = None
        if coord_cfg is not None:
            coord_cfg = dict(coord_cfg)
            window_scale = coord_cfg.pop('window_scale', None)
            self.rope_coords = RoPECoords(**coord_cfg, prefix='rope_cfg.')
            if window_scale is not None:
                self.rope_coords_window = RoPECoords(
                    **dict(coord_cfg, scale=window_scale),
                    prefix='rope_cfg.window_')
        self.drop_after_pos = nn.Dropout(drop_rate)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Resample a learnable table saved for another grid (as DeiT)."""
        key = prefix + 'pos_embed'
        if self.pos_embed is not None and key in state_dict:
            table = state_dict[key]
            if table.shape != self.pos_embed.shape:
                grid_len = table.shape[1] - self.num_cls
                side = math.isqrt(grid_len)
                if side * side == grid_len and table.shape[-1] == \
                        self.embed_dims:
                    state_dict[key] = resample_pos_embed(
                        table, (side, side), self.pretrain_grid,
                        self.num_cls, **self._resample)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _embed(
        self, x: Tensor, padding_mask: Optional[Tensor]
    ) -> Tuple[Tensor, Tuple[int, int], Optional[Tensor], Optional[Tensor],
               Optional[Tensor], Optional[Tuple[Tensor, Tensor]]]:
        """Tokens of the images with their absolute encodings, and what the
        blocks need of the grid.

        Args:
            x (Tensor): Images ``(B, in_channels, H, W)``, any H and W.
            padding_mask (Tensor, optional): ``(B, H, W)`` bool, True on
                padded pixels (bottom/right padding).

        Returns:
            tuple: The tokens ``(B, num_skip + h * w, C)`` (class token
            first; padded tokens zero), the grid ``(h, w)``, the ``(B, h, w)``
            token padding mask and the ``(B, num_skip + h * w)`` key mask
            (both None: nothing padded), and the RoPE inputs of the global
            and the window blocks (:meth:`_rope_inputs`).
        """
        b, _, H, W = x.shape
        p = self.patch_size
        # bottom/right zero padding keeps token coordinates of every pixel
        x = F.pad(x, (0, (-W) % p, 0, (-H) % p))
        x = self.patch_embed(x)
        hw_shape = (x.shape[2], x.shape[3])
        # (B, C, h, w) -> (B, h*w, C)
        x = x.flatten(2).transpose(1, 2)

        token_mask = None  # (B, h, w), True on padded tokens
        if padding_mask is not None:
            token_mask = token_padding_mask(padding_mask, self.patch_size,
                                            hw_shape)
            if not is_tracing() and not token_mask.any():
                token_mask = None  # eager shortcut; a graph keeps the mask
        key_mask = None  # (B, num_skip + h*w)
        if token_mask is not None:
            key_mask = F.pad(token_mask.flatten(1), (self.num_skip, 0))

        if self.sincos is not None:
            x = x + self.sincos(hw_shape, x.device, x.dtype)[None]
        skip = []  # (B, 1, C) class token, (B, R, C) registers
        if self.cls_token is not None:
            skip.append(self.cls_token.expand(b, -1, -1))
        if self.pos_embed is not None:
            # (B | 1, num_cls + h*w, C); DINOv2's settings: per image
            extent = None  # each image's valid grid, for DINOv2's settings
            if token_mask is not None and self._resample.get('per_image'):
                extent = valid_extent(token_mask.flatten(1), hw_shape)
            table = resample_pos_embed(
                self.pos_embed, self.pretrain_grid, hw_shape, self.num_cls,
                extent=extent, **self._resample)
            x = x + table[:, self.num_cls:]
            if skip:
                skip[0] = skip[0] + table[:, :self.num_cls]
        if self.register_tokens is not None:  # no position (DINOv2)
            skip.append(self.register_tokens.expand(b, -1, -1))
        if skip:
            x = torch.cat(skip + [x], dim=1)
        if token_mask is not None:
            x = x.masked_fill(key_mask[..., None], 0.)
        x = self.drop_after_pos(x)
        ropes = self._rope_inputs(hw_shape, token_mask, x)
        return x, hw_shape, token_mask, key_mask, ropes

    def _rope_inputs(self, hw_shape: Tuple[int, int],
                     token_mask: Optional[Tensor], x: Tensor) -> tuple:
        """``(global, window)``: for the global and the window blocks, the
        RoPE positions ``(B | 1, h * w, 2)`` of each image's valid extent
        (one augmentation draw; None: integer indices) and the ``'rope2d'``
        tables ``(cos, sin)`` at them (None without ``'rope2d'``), in
        ``x``'s device and dtype; the same pair twice without
        ``rope_cfg.window_scale``."""
        out = []
        for coords in (self.rope_coords, self.rope_coords_window):
            if coords is None and out:
                return out[0], out[0]
            rope_pos = None
            if coords is not None:
                rope_pos = coords(
                    hw_shape,
                    None if token_mask is None else token_mask.flatten(1),
                    x.device, torch.float64
                    if x.dtype == torch.float64 else torch.float32)
            rope = None
            if self.rope is not None:
                rope = self.rope(hw_shape, x.device, x.dtype, pos=rope_pos)
            out.append((rope_pos, rope))
        return tuple(out)
