"""CPVT: a plain ViT with conditional (and composable) position encodings.

Reference: Chu et al., "Conditional Positional Encodings for Vision
Transformers", ICLR 2023 (arXiv:2102.10882). The backbone is DeiT's plain
ViT (patch embedding, pre-norm blocks of :class:`~mmpe.models.layers.ViTBlock`)
with a PEG after block 0 (Sec. 3, "position 0") and global-average pooling
instead of a class token by default; the position encoding is one config
line, so the paper's comparison (none / learnable / sin-cos / PEG, plus 2D
RoPE and iRPE) and compositions such as the iRPE authors' DeiT (class token,
learnable table and iRPE in every block) are all this one class.

ViTDet's layout (Li et al., "Exploring Plain Vision Transformer Backbones
for Object Detection", ECCV 2022, Sec. 3) is two more arguments:
``window_size`` (attention inside non-overlapping windows) and
``global_blocks`` (the blocks that stay global).

Here the class (arguments, blocks, forward); the input stage (patch embedding,
position encodings, padding masks) is ``vit_input.py``, the parameters'
stages (lr decay, freezing) ``vit_stages.py``, the checks ``vit_args.py``.
"""
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch import Tensor

from ...utils.arg_checks import check_int
from ..layers.blocks.vit_block import ViTBlock
from ..layers.encodings.peg import PEG
from ..utils.vit_pos_encodings import POS_ENCODINGS, parse_pos_encoding
from .vit_args import (block_bias_cfg, block_rel_pos_cfg, check_arch,
                       check_rates,
                       parse_arch, parse_bias_cfg, parse_block_cfg,
                       parse_detectron2_options, parse_img_size,
                       parse_out_indices, parse_peg_positions,
                       parse_rel_pos_cfg, parse_rope_cfg, parse_rpe_cfg,
                       parse_window_layout)
from .vit_input import ViTInputMixin
from .vit_stages import ViTStagesMixin


@MODELS.register_module()
class CPVT(ViTInputMixin, ViTStagesMixin, BaseModule):
    """CPVT backbone: a plain ViT with a switchable position encoding.

    A DeiT-style ViT (16 x 16 patch embedding, pre-norm blocks, LayerNorm)
    whose position information comes from ``pos_encoding``:

    - ``'peg'`` (default): CPVT's Positional Encoding Generator (Sec. 3), a
      depth-wise conv with zero padding after each block in
      ``peg_positions`` (default ``(0,)``: after the first block, the
      paper's best single position; ``(0, 1, 2, 3, 4)`` is its "0-5").
    - ``'none'``: no position information.
    - ``'learnable'``: a table for the ``img_size`` grid, resampled
      bicubically to each input's grid (as DeiT at 384).
    - ``'sine'``: fixed 2D sin-cos embedding added to the patch tokens.
    - ``'rope2d'``: axial 2D rotary embedding of q and k in every block.
    - ``'rope-mixed'``: RoPE-Mixed (Heo et al., ECCV 2024), learnable
      per-head frequencies mixing x and y, one set per block (as timm's
      ``vit_*_rope_mixed_*``; weights via ``timm_vit_to_cpvt``).
      Both rotary encodings rotate by integer token positions, or, with
      ``rope_cfg=dict(coords='normalized')``, by DINOv3's patch centres
      normalised to each image's valid extent (Siméoni et al. 2025).
    - ``'irpe'``: iRPE (Wu et al., ICCV 2021) in every block's attention,
      configured by ``rpe_cfg``.
    - ``'rel-pos'``: ViTDet's decomposed relative position (MViTv2, Li et
      al. 2022) in every block's attention: per-block row and column tables
      (``q_i . R_h[iy - jy] + q_i . R_w[ix - jx]`` added to the logits),
      configured by ``rel_pos_cfg``; no class token.
    - ``'log-cpb'`` / ``'alibi-2d'`` / ``'lookhere'``: a per-head bias of
      the grid offset in every block (Swin-V2's log-spaced continuous bias,
      CROMA's 2D ALiBi, LookHere's directed masks; ``bias_cfg``; class
      tokens get 0), see :mod:`mmpe.models.layers.grid_bias`.

    A list composes them: at most one absolute encoding (``'learnable'`` or
    ``'sine'``), ``'peg'``, and at most one inside attention (``'rope2d'``,
    ``'rope-mixed'``, ``'irpe'``, ``'rel-pos'`` or a bias); ViTDet's own
    backbone is ``('learnable', 'rel-pos')``. The iRPE authors' DeiT models are
    ``pos_encoding=('learnable', 'irpe')`` with ``use_cls_token=True`` (the
    class token is iRPE's skip token); see
    ``tools/model_converters/deit_irpe_to_mmpe.py``.

    Inputs of any size are padded bottom/right to a multiple of the patch
    size; outputs are NCHW maps at stride ``patch_size`` covering the padded
    grid ``(ceil(H / p), ceil(W / p))``.

    **Padded batches.** MMDetection detectors call ``backbone(images)``
    without masks, so by default the batch padding is image content there
    (as for CNN backbones). A pixel mask -- ``forward(x, padding_mask)``,
    which the ``PaddingAware*`` detectors pass from their data samples
    (:mod:`mmpe.models.detectors.padding_aware`) -- makes padded tokens
    invisible instead: they are never attended to, PEG
    zeroes them before its convolution (so its zero-padding cue is each
    image's own border) and their outputs are zero; every image then gets
    exactly its single-image features on its valid region (except with
    ``'learnable'``, whose table is resampled to the padded grid).

    **Windows (ViTDet).** ``window_size=S > 0`` makes every block not in
    ``global_blocks`` attend inside non-overlapping ``S x S`` windows
    (ViTDet: S = 14 with global blocks 2, 5, 8, 11 of 12). The grid is
    padded bottom/right to whole windows inside each window block; the
    padded tokens are masked keys and are cropped after the attention, and
    with a pixel ``padding_mask`` the batch padding is masked too. Windows
    add no parameters, so the same checkpoints load. Each encoding acts on
    the full grid or on the windows as follows: PEG between blocks and the
    absolute tables at the input, on the full grid; RoPE rotates every token
    by its full-grid position in both kinds of block; iRPE uses the window
    grid ``(S, S)`` in window blocks (one bucket plan for all windows) and
    the full grid in global blocks; ``'rel-pos'`` likewise: window blocks
    own tables of ``2 S - 1`` rows used on the ``(S, S)`` window grid,
    global blocks tables made for ``rel_pos_cfg['input_size']`` (default
    the pre-training grid), resized linearly to each input's grid (as
    ViTDet). A class token has no window: it is refused with windows.
    ``window_padding='zeros'`` and ``pos_embed_interp='detectron2'`` compute
    what detectron2's ViTDet computes (its checkpoints: ``tools/
    model_converters/vitdet_d2_to_mmpe.py``).

    Args:
        arch (str | dict): Preset name in :attr:`arch_zoo` (``'tiny'``,
            ``'small'``, ``'base'`` and aliases) or a dict with keys
            ``embed_dims``, ``depth``, ``num_heads``, ``mlp_ratio``.
            Defaults to 'small'.
        img_size (int | tuple[int, int]): Pre-training image size; sets the
            grid of the ``'learnable'`` table. Defaults to 224.
        patch_size (int): Patch size p (the output stride). Defaults to 16.
        in_channels (int): Input channels. Defaults to 3.
        out_indices (int | Sequence[int]): Blocks whose outputs are returned
            (negative counts from the end). Defaults to -1.
        pos_encoding (str | Sequence[str]): One of :attr:`POS_ENCODINGS`, or
            a list composing them (see above). Defaults to 'peg'.
        peg_positions (Sequence[int]): Blocks followed by a PEG (only for
            ``'peg'``). Defaults to (0,).
        peg_kernel_size (int): Odd PEG kernel size. Defaults to 3.
        use_cls_token (bool): Prepend a class token (a skip token for every
            position encoding). Defaults to False (the paper's GAP).
        num_register_tokens (int): Register tokens after the class token
            (Darcet et al., "Vision Transformers Need Registers", ICLR
            2024; DINOv2's ``register_tokens``, DINOv3's storage tokens):
            skip tokens without a row in the position table. Defaults to 0.
        block_cfg (dict, optional): Further arguments of every
            :class:`~mmpe.models.layers.ViTBlock`: ``layer_scale_init``
            (LayerScale on both residual branches; DINOv2 / DINOv3) and
            ``mlp_type`` (``'mlp'``, ``'swiglu'``, ``'swiglu-subln'``:
            EVA-02). Defaults to None (a plain block).
        qkv_bias (bool): Bias in the qkv projections. Defaults to True.
        drop_rate (float): Dropout after position embedding and projections.
            Defaults to 0.
        attn_drop_rate (float): Dropout on attention probabilities.
            Defaults to 0.
        drop_path_rate (float): Stochastic depth rate of the last block,
            increasing linearly from 0. Defaults to 0.
        norm_cfg (dict): Norm config. Defaults to LN with eps 1e-6.
        final_norm (bool): Apply the final norm to every output.
            Defaults to True.
        sine_temperature (float): Temperature of ``'sine'``.
            Defaults to 10000.
        rope_theta (float, optional): Frequency base of ``'rope2d'`` /
            ``'rope-mixed'`` (the same as ``rope_cfg.theta``; giving both
            with different values is a ValueError). Defaults to None:
            100 / 10 (Heo et al.).
        rope_cfg (dict, optional): For ``'rope2d'`` / ``'rope-mixed'``: the
            keys of ``encoder_pe.relative`` of that type
            (:data:`~mmpe.models.layers.encodings.rope_coords.ROPE_ARGS`): ``theta``,
            ``rotate`` (RoPE-Mixed), and the token coordinates
            (:mod:`mmpe.models.layers.encodings.rope_coords`) ``coords``
            (``'index'``, integer token positions, the default; or
            ``'normalized'``, DINOv3's patch centres in ``[-1, 1]`` of each
            image's valid extent, read from the token padding mask; without
            a mask the padded grid is the image), ``normalize``
            (``'separate'``, ``'max'`` or ``'min'``) and the training-only
            augmentations ``shift``, ``jitter``, ``rescale`` (drawn anew for
            every block, as DINOv3); ``scale`` (positions times a factor,
            one or per axis: EVA-02's RoPE interpolated from its
            pretraining grid) and ``window_scale`` (the window blocks'
            factor). Defaults to None (integer indices).
        rpe_cfg (dict, optional): For ``'irpe'``: arguments of
            ``mmpe.models.layers.iRPE`` other than ``head_dim``,
            ``num_heads``, ``on`` and ``skip`` (set from
            ``use_cls_token``), plus ``rpe_on`` (one of
            :data:`RPE_ON_CHOICES`, default 'k'). Defaults to None, i.e.
            ``dict(mode='contextual', method='product', ratio=1.9,
            rpe_on='k')`` for ``'irpe'``.
        rel_pos_cfg (dict, optional): For ``'rel-pos'``: ``input_size``,
            the grid (in patches) the global blocks' tables are made for
            (ViTDet: the detection input, 1024 / 16 = 64; default
            ``img_size // patch_size``), and ``init`` (``'zeros'``, ViTDet's
            default, or ``'trunc_normal'``) of every block's tables (see
            ``mmpe.models.layers.DecomposedRelPos``). Window blocks' tables
            are made for ``(window_size, window_size)``. Defaults to None.
        bias_cfg (dict, optional): For ``'log-cpb'`` / ``'alibi-2d'`` /
            ``'lookhere'``: the arguments of that bias (``mmpe.models.
            layers.grid_bias``); log-CPB's ``pretrained_size`` defaults to
            ``img_size // patch_size`` in global blocks and is ``(S, S)`` in
            window blocks; LookHere's layer slope follows the block index.
            Defaults to None.
        window_size (int): Window side S in patches; 0 (default) attends
            globally in every block. Defaults to 0.
        global_blocks (Sequence[int]): Blocks that attend globally when
            ``window_size > 0`` (indices in ``[0, depth)``). Defaults to ().
        window_padding (str): The tokens padding the grid to whole windows
            are masked keys (``'masked'``) or, as in detectron2's ViTDet,
            zero tokens that every query of the window attends to
            (``'zeros'``; the batch padding of a ``padding_mask`` stays
            masked; refused with RoPE). Defaults to 'masked'.
        pos_embed_interp (str): How the ``'learnable'`` table is resampled
            to the input's grid: ``'timm'`` (antialiased bicubic) or
            ``'detectron2'`` (ViTDet's ``get_abs_pos``: plain bicubic), see
            :data:`~mmpe.models.layers.encodings.pos_embed_2d.POS_EMBED_INTERPS`.
            Defaults to 'timm'.
        attn_impl (str): Attention backend of every block, ``'auto'``,
            ``'explicit'``, ``'chunked'``, ``'sdpa'`` or ``'flex'`` (see
            :class:`~mmpe.models.layers.PEAttention`). Defaults to 'auto'
            (explicit on short sequences, chunked from
            ``AUTO_CHUNKED_FROM`` tokens on while training).
        frozen_stages (int): -1 freezes nothing; 0 the patch embedding,
            class token and position table; ``k >= 1`` also blocks
            ``0 .. k-1``, their PEGs and RoPE-Mixed frequencies;
            ``depth`` also the final norm. Defaults to -1.
        init_cfg (dict | list[dict], optional): Initialisation config, e.g.
            ``dict(type='Pretrained', checkpoint=...)`` with a file made by
            ``tools/model_converters/timm_vit_to_cpvt.py``.
            Defaults to None.
    """

    arch_zoo = {
        **dict.fromkeys(['t', 'tiny', 'deit-t', 'deit-tiny'], dict(
            embed_dims=192, depth=12, num_heads=3, mlp_ratio=4.)),
        **dict.fromkeys(['s', 'small', 'deit-s', 'deit-small'], dict(
            embed_dims=384, depth=12, num_heads=6, mlp_ratio=4.)),
        **dict.fromkeys(['b', 'base', 'deit-b', 'deit-base'], dict(
            embed_dims=768, depth=12, num_heads=12, mlp_ratio=4.)),
    }
    essential_keys = {'embed_dims', 'depth', 'num_heads', 'mlp_ratio'}
    POS_ENCODINGS = POS_ENCODINGS

    def __init__(self,
                 arch: Union[str, dict] = 'small',
                 img_size: Union[int, Tuple[int, int]] = 224,
                 patch_size: int = 16,
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = -1,
                 pos_encoding: Union[str, Sequence[str]] = 'peg',
                 peg_positions: Sequence[int] = (0, ),
                 peg_kernel_size: int = 3,
                 use_cls_token: bool = False,
                 num_register_tokens: int = 0,
                 block_cfg: Optional[dict] = None,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
                 final_norm: bool = True,
                 sine_temperature: float = 10000.,
                 rope_theta: Optional[float] = None,
                 rope_cfg: Optional[dict] = None,
                 rpe_cfg: Optional[dict] = None,
                 rel_pos_cfg: Optional[dict] = None,
                 bias_cfg: Optional[dict] = None,
                 window_size: int = 0,
                 global_blocks: Sequence[int] = (),
                 window_padding: str = 'masked',
                 pos_embed_interp: str = 'timm',
                 attn_impl: str = 'auto',
                 frozen_stages: int = -1,
                 init_cfg: Optional[Union[dict, List[dict]]] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.arch_settings = parse_arch(arch, self.arch_zoo,
                                        self.essential_keys)
        embed_dims = self.arch_settings['embed_dims']
        depth = self.arch_settings['depth']
        num_heads = self.arch_settings['num_heads']
        mlp_ratio = self.arch_settings['mlp_ratio']
        check_arch(self.arch_settings, patch_size, in_channels)
        encodings = parse_pos_encoding(pos_encoding)
        img_size = parse_img_size(img_size)
        if not -1 <= frozen_stages <= depth:
            raise ValueError(f'`frozen_stages` must be in [-1, {depth}] '
                             f'(depth), got {frozen_stages}')
        check_rates(
            drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            drop_path_rate=drop_path_rate)
        check_int('num_register_tokens', num_register_tokens, minimum=0)
        window_size, global_blocks = parse_window_layout(
            window_size, global_blocks, depth,
            use_cls_token, num_register_tokens)
        rope_args, coord_cfg = parse_rope_cfg(rope_cfg, rope_theta,
                                              encodings)
        # resample_pos_embed's arguments of `pos_embed_interp`
        resample = parse_detectron2_options(window_padding, pos_embed_interp,
                                            encodings, window_size)

        self.embed_dims = embed_dims
        self.depth = depth
        self.num_heads = num_heads
        self.patch_size = patch_size
        self.pos_encoding = pos_encoding
        self.pos_encodings = encodings
        self.use_cls_token = use_cls_token
        self.num_registers = num_register_tokens
        # class token then registers: the blocks' skip tokens
        self.num_skip = int(use_cls_token) + num_register_tokens
        self.final_norm = final_norm
        self.frozen_stages = frozen_stages
        self.out_indices = parse_out_indices(out_indices, depth)
        self.window_size = window_size
        self.global_blocks = global_blocks
        self.pretrain_grid = (img_size[0] // patch_size,
                              img_size[1] // patch_size)

        self._init_input(in_channels, encodings, sine_temperature, rope_args,
                         coord_cfg, drop_rate, resample)

        block_rpe_cfg, rpe_on = parse_rpe_cfg(rpe_cfg, encodings,
                                              self.num_skip)
        rel_pos_cfg = parse_rel_pos_cfg(rel_pos_cfg, encodings,
                                        self.num_skip > 0, self.pretrain_grid)
        bias_cfg = parse_bias_cfg(bias_cfg, encodings, self.pretrain_grid)
        # on the CPU whatever the default device (a model built on 'meta')
        dpr = torch.linspace(0, drop_path_rate, depth, device='cpu').tolist()
        self.blocks = nn.ModuleList([
            ViTBlock(
                embed_dims,
                num_heads,
                mlp_ratio,
                qkv_bias=qkv_bias,
                drop=drop_rate,
                drop_path=dpr[i],
                norm_cfg=norm_cfg,
                attn_drop=attn_drop_rate,
                rpe_cfg=block_rpe_cfg,
                rpe_on=rpe_on,
                attn_impl=attn_impl,
                skip=self.num_skip,
                rel_pos_cfg=block_rel_pos_cfg(rel_pos_cfg, i, window_size,
                                              global_blocks),
                bias_cfg=block_bias_cfg(bias_cfg, i, depth, window_size,
                                        global_blocks),
                **parse_block_cfg(block_cfg),
                window_size=0 if i in global_blocks else window_size,
                window_padding=window_padding)
            for i in range(depth)
        ])

        self.peg_positions: Tuple[int, ...] = ()
        self.pegs = nn.ModuleList()
        if 'peg' in encodings:
            self.peg_positions = parse_peg_positions(peg_positions, depth)
            self.pegs.extend(
                PEG(embed_dims, peg_kernel_size)
                for _ in self.peg_positions)
        self.norm = build_norm_layer(norm_cfg, embed_dims)[1] \
            if final_norm else nn.Identity()

        self._init_default_weights()
        self._freeze_stages()

    # ------------------------------------------------------------------ #
    def _init_default_weights(self) -> None:
        """DeiT initialisation: trunc-normal(0.02) linears and tables."""
        for m in self.blocks.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for token in (self.cls_token, self.register_tokens):
            if token is not None:
                trunc_normal_(token, std=.02)
        if self.pos_embed is not None:
            trunc_normal_(self.pos_embed, std=.02)

    # ------------------------------------------------------------------ #
    def forward_tokens(
            self,
            x: Tensor,
            padding_mask: Optional[Tensor] = None
    ) -> Tuple[List[Tensor], Tuple[int, int]]:
        """Tokens after every block (each PEG applied after its block).

        Args:
            x (Tensor): Images ``(B, in_channels, H, W)``, any H and W.
            padding_mask (Tensor, optional): ``(B, H, W)`` bool, True on
                padded pixels (bottom/right padding). Defaults to None.

        Returns:
            tuple: ``depth`` tensors ``(B, num_skip + h * w, C)`` before the
            final norm (class token first) and the grid ``(h, w)``.
        """
        tokens, hw_shape, _ = self._tokens(x, padding_mask)
        return tokens, hw_shape

    def _tokens(
        self, x: Tensor, padding_mask: Optional[Tensor]
    ) -> Tuple[List[Tensor], Tuple[int, int], Optional[Tensor]]:
        """:meth:`forward_tokens` and the ``(B, h, w)`` token padding mask
        (None: nothing padded)."""
        x, hw_shape, token_mask, key_mask, ropes = self._embed(
            x, padding_mask)

        pegs = dict(zip(self.peg_positions, self.pegs))
        # DINOv3 draws its coordinate augmentation anew in every block
        redraw = self.rope_coords is not None and self.rope_coords.augments
        tokens = []
        for i, block in enumerate(self.blocks):
            if i and redraw:
                ropes = self._rope_inputs(hw_shape, token_mask, x)
            # the positions and tables of a global / window block
            rope_pos, rope = ropes[bool(getattr(block, 'window_size', 0))]
            if self.ropes:
                rope = self.ropes[i](hw_shape, x.device, x.dtype,
                                     pos=rope_pos)
            x = block(x, hw_shape, rope, key_mask)
            if i in pegs:
                x = pegs[i](x, hw_shape, token_mask, self.num_skip)
            tokens.append(x)
        return tokens, hw_shape, token_mask

    def forward(self,
                x: Tensor,
                padding_mask: Optional[Tensor] = None) -> Tuple[Tensor, ...]:
        """Feature maps of the blocks in ``out_indices``.

        Args:
            x (Tensor): Images ``(B, in_channels, H, W)``, any H and W.
            padding_mask (Tensor, optional): ``(B, H, W)`` bool, True on
                padded pixels (bottom/right padding). Defaults to None.

        Returns:
            tuple[Tensor]: One ``(B, embed_dims, ceil(H / p), ceil(W / p))``
            map per entry of ``out_indices``, in block order.
        """
        tokens, (h, w), token_mask = self._tokens(x, padding_mask)
        outs = []
        for i in self.out_indices:
            out = self.norm(tokens[i][:, self.num_skip:])
            if token_mask is not None:
                out = out.masked_fill(token_mask.flatten(1)[..., None], 0.)
            # (B, h*w, C) -> (B, C, h, w)
            outs.append(out.transpose(1, 2).reshape(x.shape[0], -1, h, w))
        return tuple(outs)
