"""The one attention of mmpe: scaled dot-product attention with position
encodings inside it.

For projected queries, keys and values (B, H, L, d) of ``L = skip + h * w``
tokens it computes, with iRPE (Wu et al., "Rethinking and Improving Relative
Position Encoding for Vision Transformer", ICCV 2021, Eq. 16-17) and RoPE:

.. math::

    e_{ij} = \\frac{\\tilde q_i \\tilde k_j^T}{\\sqrt d}
             + \\frac{q_i}{\\sqrt d} r^K_{b(i, j)}
             + \\frac{k_j}{\\sqrt d} r^Q_{b(j, i)} + m_{ij}, \\quad
    z_i = \\sum_j \\mathrm{softmax}_j(e_{ij}) (v_j + r^V_{b(i, j)})

where :math:`\\tilde q, \\tilde k` are the RoPE-rotated ``q, k`` (RoPE off:
``q, k``), :math:`m` the additive key-padding / attention mask, and the
``r`` terms iRPE's bias (a table entry) or contextual (``x . table``) terms.
As in the authors' release, ``q`` is scaled before it meets ``r^K`` and ``k``
before ``r^Q``. Instead of iRPE, the logits may get ViTDet's decomposed
relative position ``q_i . R^h_{iy - jy} + q_i . R^w_{ix - jx}`` (MViTv2,
Li et al. 2022, of the unscaled ``q``;
:mod:`~mmpe.models.layers.decomposed.rel_pos`). Every mmpe attention (the
DETR encoder layers, the ViT backbone blocks) is a subclass that only adds
its projections, so masks,
skip tokens, dropout and the backends below exist once.
"""
import math
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from mmengine.model import BaseModule
from torch import Tensor

from ....utils.arg_checks import check_int
from ..common.arg_checks import (ATTN_IMPL_CHOICES, RPE_ON_CHOICES,
                                 check_choice, check_grid)
from ..common.tracing import is_exporting, is_tracing
from ..decomposed.rel_pos import DecomposedRelPos
from ..encodings.rope2d import apply_rope2d
from ..grid_bias.build import build_grid_bias
from ..irpe.irpe import iRPE
from ..terms.relative_term import RelativeTerm
from .backend_rule import AttentionCall
from .backends import (ATTENTION_BACKENDS, AttentionRequest, fused_backend,
                       select_backend)
from .backends import attend as attend_request


class PEAttention(BaseModule):
    """Attention core with iRPE terms, RoPE, key padding and skip tokens.

    Subclasses own the projections (and with them a checkpoint layout) and
    call :meth:`attend` with ``(B, H, L, head_dim)`` tensors. A call reads
    as RoPE -> relative terms (:meth:`request`) -> the rule -> a backend
    (:mod:`~mmpe.models.layers.attention.backends`: one module each,
    chosen through a registry).

    Args:
        embed_dims (int): Channels C of the tokens.
        num_heads (int): Heads; must divide ``embed_dims``.
        attn_drop (float): Dropout on the attention probabilities.
            Defaults to 0.
        rpe_cfg (dict, optional): Arguments of :class:`iRPE` other than
            ``head_dim``, ``num_heads`` and ``on`` (``mode``, ``method``,
            ``ratio``, ``index``, ``shared_head``, ``skip``, ``init``...).
            None: no iRPE. Defaults to None.
        rpe_on (str): Where iRPE goes, one of :data:`RPE_ON_CHOICES`.
            Defaults to ``'k'``.
        attn_impl (str): The backend, one of :data:`ATTN_IMPL_CHOICES`
            (docs/user_guides/attention_backends.md). Defaults to
            ``'auto'``. Without iRPE every backend is
            ``F.scaled_dot_product_attention``.

            - ``'auto'``: the rule of
              :mod:`~mmpe.models.layers.attention.backend_rule`: the fused
              kernel of the device (C++ on CPU, Triton on CUDA) where it
              applies; otherwise SDPA with the terms as a constant mask (no
              gradient into them, no iRPE on values) or ``'explicit'``
              below ``AUTO_CHUNKED_FROM`` tokens, ``'chunked'`` from there
              on; on CUDA the dense backend while its memory estimate fits
              a share of the free memory, then ``'flex'`` where it applies
              (no backward), else ``'chunked'`` with a warning naming why
              the fused kernel does not apply, once per module.
            - ``'explicit'``: logits ``(B, H, L, L)``, the iRPE terms added
              into them in place, softmax, ``@ v`` (+ iRPE on values), kept
              for autograd's backward; inference as ``'auto'``.
            - ``'chunked'``: the same steps on ``chunk_size`` query rows at
              a time, with a backward that recomputes each chunk
              (:mod:`~mmpe.models.layers.attention.chunked`): exact, no
              ``(B, H, L, L)`` tensor kept, in training and inference.
              Its attention dropout draws its own masks (redrawn, not
              stored, for the backward).
            - ``'fused'``: mmpe's fused kernel of the device: on CPU the
              C++ kernel (:mod:`~mmpe.models.layers.attention.fused`), on
              CUDA the Triton kernel
              (:mod:`~mmpe.models.layers.attention.fused_triton`): logits,
              term, mask and softmax of a block of query rows in one pass,
              a backward that recomputes the blocks from the rows'
              log-sum-exp; no ``(L, L)`` tensor, the time of fused
              attention up to the terms. For terms over per-axis buckets:
              iRPE product / cross on queries, keys and values (contextual
              or bias), the decomposed relative position, skip tokens
              included (and on CUDA BoxRPB's cross-attention); CPU float32
              / float64 / bfloat16 / float16, CUDA float32 / bfloat16 /
              float16; attention dropout inside the Triton kernel (its own
              Philox masks, redrawn in the backward), none on CPU. Where it
              does not apply the call runs ``'chunked'`` with a warning,
              once per module.
            - ``'sdpa'``: the iRPE terms (with their gradient) materialised
              as the float mask of ``F.scaled_dot_product_attention``.
              iRPE on values is not possible there (it needs the
              probabilities).
            - ``'flex'``: FlexAttention with the terms in a ``score_mod``
              (:mod:`~mmpe.models.layers.attention.flex`). Where it does not
              apply (iRPE on values, RoPE, an ``attn_mask``, attention
              dropout while training, no iRPE on q / k, a backward on CPU,
              another dtype, a failed compilation) the call runs
              ``'explicit'`` with a warning, once per module.

            While ``torch.compile`` traces a training step, ``'explicit'``
            and ``'chunked'`` run as the custom op ``mmpe::attention``
            (eager kernels inside the compiled graph).
        skip (int, optional): Leading tokens outside the grid (class
            tokens): iRPE gives them its extra bucket, RoPE leaves them
            unrotated. None: ``rpe_cfg['skip']`` or 0. Defaults to None.
        chunk_size (int, optional): Query rows per chunk of ``'chunked'``
            (and of ``'auto'`` when it chunks). None: automatic, about
            :data:`~mmpe.models.layers.attention.chunked.CHUNK_ELEMENTS`
            logits per chunk. Defaults to None.
        rel_pos_cfg (dict, optional): Arguments of
            :class:`~mmpe.models.layers.DecomposedRelPos` other than
            ``head_dim`` (``input_size``, ``init``): ViTDet's decomposed
            relative position in the logits, a relative term like iRPE's
            (every backend runs it). Not with iRPE, RoPE (refused at the
            call) or skip tokens. None: none. Defaults to None.
        bias_cfg (dict, optional): A per-head bias of the grid offset in
            the logits (:mod:`~mmpe.models.layers.grid_bias`):
            ``dict(type='log-cpb', pretrained_size=...)`` (Swin-V2),
            ``dict(type='alibi-2d')`` or ``dict(type='lookhere', ...)``;
            skip tokens get 0. Not with iRPE or ``rel_pos_cfg``. None:
            none. Defaults to None.
        init_cfg (dict, optional): Initialisation config. Defaults to None.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 attn_drop: float = 0.,
                 rpe_cfg: Optional[Dict] = None,
                 rpe_on: str = 'k',
                 attn_impl: str = 'auto',
                 skip: Optional[int] = None,
                 chunk_size: Optional[int] = None,
                 rel_pos_cfg: Optional[Dict] = None,
                 bias_cfg: Optional[Dict] = None,
                 init_cfg: Optional[Dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        check_int('embed_dims', embed_dims)
        check_int('num_heads', num_heads)
        if embed_dims % num_heads:
            raise ValueError(
                f'`num_heads` must be a positive int dividing `embed_dims` '
                f'({embed_dims}), got {num_heads!r}')
        check_choice('rpe_on', rpe_on, RPE_ON_CHOICES)
        check_choice('attn_impl', attn_impl, ATTN_IMPL_CHOICES)
        check_int('chunk_size', chunk_size, hint='automatic',
                  allow_none=True)
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.attn_drop_prob = float(attn_drop)
        self.attn_impl = attn_impl
        self.chunk_size = chunk_size
        self.rpe_cfg = None if rpe_cfg is None else dict(rpe_cfg)
        cfg_skip = (self.rpe_cfg or {}).get('skip')
        if skip is None:
            skip = 0 if cfg_skip is None else cfg_skip
        elif cfg_skip is not None and cfg_skip != skip:
            raise ValueError(f'`rpe_cfg.skip` ({cfg_skip!r}) differs from the '
                             f'attention\'s `skip` ({skip!r}); leave it out')
        check_int('skip', skip, minimum=0)
        self.skip = skip
        self.rpe_on = rpe_on if rpe_cfg is not None else ''
        if attn_impl == 'sdpa' and 'v' in self.rpe_on:
            raise ValueError(
                f"Unsupported `rpe_on` {rpe_on!r} with attn_impl='sdpa' (iRPE "
                "on values needs the attention probabilities), please choose "
                "`rpe_on` without 'v' or `attn_impl` from ('auto', "
                "'explicit', 'chunked', 'flex')")
        for letter in 'qkv':
            rpe = None
            if letter in self.rpe_on:
                cfg = {
                    key: value
                    for key, value in self.rpe_cfg.items()
                    if key not in ('head_dim', 'num_heads', 'on', 'type',
                                   'skip')
                }
                rpe = iRPE(
                    head_dim=self.head_dims, num_heads=num_heads, on=letter,
                    skip=skip, **cfg)
            setattr(self, f'rpe_{letter}', rpe)
        self.rel_pos = None
        if rel_pos_cfg is not None:
            if rpe_cfg is not None:
                raise ValueError(
                    f'`rel_pos_cfg` {rel_pos_cfg!r} together with `rpe_cfg` '
                    f'{rpe_cfg!r}: one relative position per attention, '
                    'please choose `rel_pos_cfg` (decomposed, ViTDet) or '
                    '`rpe_cfg` (iRPE)')
            if skip:
                raise ValueError(
                    f'`rel_pos_cfg` with skip={skip} tokens: the decomposed '
                    'relative position has no entry for tokens outside the '
                    'grid (ViTDet has no class token); choose skip=0')
            cfg = {k: v for k, v in rel_pos_cfg.items() if k != 'type'}
            if 'head_dim' in cfg:
                raise ValueError('`rel_pos_cfg.head_dim` is set by the '
                                 'attention; remove it')
            self.rel_pos = DecomposedRelPos(head_dim=self.head_dims, **cfg)
        if bias_cfg is not None and (rpe_cfg or rel_pos_cfg) is not None:
            raise ValueError(
                f'`bias_cfg` {bias_cfg!r} together with `rpe_cfg` / '
                '`rel_pos_cfg`: one relative position per attention, please '
                'choose one of them')
        self.grid_bias = build_grid_bias(bias_cfg, num_heads)
        self._warned = set()  # messages this module has warned about
        self._flex_failed = set()  # (device type, dtype) that did not compile

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, L, C) -> (B, H, L, head_dims)."""
        bs, n, _ = x.shape
        return x.view(bs, n, self.num_heads, self.head_dims).transpose(1, 2)

    @staticmethod
    def merge_heads(x: Tensor) -> Tensor:
        """(B, H, L, head_dims) -> (B, L, C)."""
        return x.transpose(1, 2).flatten(2)

    def attend(self,
               q: Tensor,
               k: Tensor,
               v: Tensor,
               spatial_shape: Optional[Sequence[int]] = None,
               key_padding_mask: Optional[Tensor] = None,
               attn_mask: Optional[Tensor] = None,
               rope: Optional[Tuple[Tensor, Tensor]] = None,
               terms: Sequence[RelativeTerm] = ()) -> Tensor:
        """Attention of projected tokens (module docstring's equation).

        Args:
            q (Tensor): Queries (B, H, L, head_dims), not scaled.
            k (Tensor): Keys (B, H, L, head_dims).
            v (Tensor): Values (B, H, L, head_dims).
            spatial_shape (tuple[int, int], optional): Token grid ``(h, w)``
                with ``L = skip + h * w``; required with iRPE.
            key_padding_mask (Tensor, optional): (B, L) bool, True at padded
                keys, which get no attention.
            attn_mask (Tensor, optional): (L, L) bool (True = not allowed) or
                additive float mask.
            rope (tuple[Tensor, Tensor], optional): ``(cos, sin)`` of a
                rotary embedding (e.g. :class:`RoPE2D`), rotating the grid
                tokens of q and k (skip tokens untouched). Each is one
                table for all images, ``(h * w, head_dims)`` or per head
                ``(H, h * w, head_dims)``, or per image (positions that
                differ between the images of a batch, e.g. normalised
                coordinates of padded images): ``(B, 1, h * w,
                head_dims)`` or ``(B, H, h * w, head_dims)``; see
                :func:`apply_rope2d`.
            terms (list[RelativeTerm]): Logit terms of this call built by
                the caller, added after the module's own (e.g. a decoder's
                box-to-pixel bias, :class:`~mmpe.models.layers.BoxRPB`).
                Defaults to ().

        Returns:
            Tensor: (B, H, L, head_dims).
        """
        request = self.request(q, k, v, spatial_shape, key_padding_mask,
                               attn_mask, rope, terms)
        return attend_request(request, self.attn_impl, self._warn_once,
                              type(self).__name__)

    def request(self,
                q: Tensor,
                k: Tensor,
                v: Tensor,
                spatial_shape: Optional[Sequence[int]] = None,
                key_padding_mask: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None,
                rope: Optional[Tuple[Tensor, Tensor]] = None,
                terms: Sequence[RelativeTerm] = ()) -> AttentionRequest:
        """The call as the backends see it (arguments of :meth:`attend`):
        RoPE applied, the relative terms built from the unrotated q and k
        (:meth:`relative_terms`, then ``terms``)."""
        height = width = 0
        has_terms = self.has_relative_terms or bool(terms)
        if has_terms:
            height, width = self._check_grid(q, k, spatial_shape)
        if rope is not None and self.rel_pos is not None:
            raise ValueError(
                f'{type(self).__name__} with `rel_pos_cfg` got `rope`: the '
                'decomposed relative position and RoPE in one attention is '
                'not supported; choose one of them')
        # iRPE reads the unrotated q and k (its terms stay relative)
        terms_qk = (q, k)
        if rope is not None:
            q = apply_rope2d(q, *rope, num_skip=self.skip)
            k = apply_rope2d(k, *rope, num_skip=self.skip)
        if key_padding_mask is not None and not is_tracing() \
                and key_padding_mask.device.type == 'cpu' \
                and not key_padding_mask.any():
            # nothing padded (no sync on CPU); a graph keeps the zero mask
            key_padding_mask = None
        scale = 1.0 / math.sqrt(q.shape[-1])
        request = AttentionRequest(
            q, k, v, scale, attn_mask=attn_mask,
            key_padding_mask=key_padding_mask, dropout_p=self._dropout_p(),
            chunk_size=self.chunk_size or 0, has_rope=rope is not None,
            flex_rpe=(self.rpe_k, self.rpe_q), flex_failed=self._flex_failed,
            uses_rel_pos=self.rel_pos is not None)
        if has_terms:
            # the scaled unrotated queries are the logits' queries without
            # RoPE: one tensor, kept once for the backward
            qs = terms_qk[0] * scale
            ks = terms_qk[1] * scale if self.rpe_q is not None else None
            request.terms = self.relative_terms(qs, ks, height,
                                                width) + list(terms)
            request.q_logits = qs if rope is None else q * scale
            request.height, request.width = height, width
        return request

    def select_backend(self,
                       length: int,
                       needs_grad: bool,
                       flex_ok: bool = False,
                       impl: Optional[str] = None,
                       fused_ok: bool = False,
                       call: Optional[AttentionCall] = None,
                       free_bytes: Optional[int] = None) -> str:
        """The backend this module's ``attn_impl`` (or ``impl``) takes for a
        call of ``length`` tokens, from sizes alone
        (:func:`~mmpe.models.layers.attention.backends.select_backend`;
        ``call`` None: ``length`` and ``needs_grad`` on CPU)."""
        if not self.has_relative_terms:
            return 'sdpa'
        if call is None:
            call = AttentionCall(length, needs_grad, self.rpe_v is not None)
        return select_backend(self.attn_impl if impl is None else impl,
                              call, flex_ok, fused_ok, free_bytes)

    def _fused_reason(self, q: Tensor,
                      terms: Sequence[RelativeTerm]) -> Optional[str]:
        """Why the fused kernel of ``q``'s device does not apply to a call
        of this module with ``terms``, or None."""
        request = AttentionRequest(q, q, q, 1.0, list(terms),
                                   dropout_p=self._dropout_p())
        return ATTENTION_BACKENDS[fused_backend(q.device.type)].reason(
            request)

    def _dropout_p(self) -> float:
        return self.attn_drop_prob if self.training else 0.0

    def _warn_once(self, msg: str) -> None:
        if msg not in self._warned:
            self._warned.add(msg)
            warnings.warn(msg, stacklevel=4)

    # ------------------------------------------------------------------
    # relative terms
    # ------------------------------------------------------------------
    @property
    def has_relative_terms(self) -> bool:
        """Whether calls have relative terms (iRPE, the decomposed
        relative position or an offset bias)."""
        return bool(self.rpe_on) or self.rel_pos is not None \
            or self.grid_bias is not None

    def relative_terms(self, qs: Tensor, ks: Optional[Tensor], height: int,
                       width: int) -> List[RelativeTerm]:
        """The relative terms of one call, in the order they are added:
        iRPE on keys (from the scaled queries), on queries (from the scaled
        keys), the decomposed relative position (from the scaled queries)
        or an offset bias (``bias_cfg``), iRPE on values. A new kind of
        term is added here (see docs/design.md, "How to add a relative
        term").

        Args:
            qs (Tensor): Unrotated queries times ``1 / sqrt(head_dims)``
                (B, H, L, head_dims); without RoPE the very tensor the
                logits use.
            ks (Tensor, optional): Unrotated keys, scaled alike; None when
                no term reads them (no iRPE on queries).
            height (int): Grid height.
            width (int): Grid width.

        Returns:
            list[RelativeTerm]: Logit terms, then value terms.
        """
        terms = [rpe.term(x, height, width)
                 for rpe, x in ((self.rpe_k, qs), (self.rpe_q, ks))
                 if rpe is not None]
        if self.rel_pos is not None:
            terms.append(self.rel_pos.term(qs, height, width))
        if self.grid_bias is not None:
            terms.append(self.grid_bias.term(qs, height, width))
        if self.rpe_v is not None:
            terms.append(self.rpe_v.term(qs, height, width))
        return terms

    def _check_grid(self, q: Tensor, k: Tensor,
                    spatial_shape: Optional[Sequence[int]]) -> Tuple[int, int]:
        if spatial_shape is None:
            raise ValueError(
                f'{type(self).__name__} needs `spatial_shape=(height, width)` '
                f'of the token grid with relative terms (rpe_on='
                f'{self.rpe_on!r}, rel_pos '
                f'{"on" if self.rel_pos is not None else "off"}, bias_cfg '
                f'{"on" if self.grid_bias is not None else "off"}); got None')
        height, width = check_grid(*spatial_shape)
        expected = self.skip + height * width
        if q.shape[2] != expected or k.shape[2] != expected:
            raise ValueError(
                f'`spatial_shape` {(height, width)} with skip={self.skip} '
                f'means {expected} tokens, but query has {q.shape[2]} and '
                f'key has {k.shape[2]}')
        return height, width
