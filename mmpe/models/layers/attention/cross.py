"""Cross-attention of a DETR decoder through mmpe's attention core, with
relative terms between the queries and the key grid (BoxRPB).

:class:`CrossPEAttention` is :class:`~mmpe.models.layers.PEAttention` for
``Q`` queries against the ``L = h * w`` keys of a feature grid: the core
(masks, dropout, the explicit / chunked / SDPA backends) with the call's
logit terms built by the caller (``attend(..., terms=[...])``).
:class:`BiasedConditionalAttention` is mmdet's ``ConditionalAttention``
(Conditional DETR, DAB-DETR) in its cross-attention form, computing
mmdet's queries and keys exactly (per head, the content part then the
spatial part, ``2 d`` channels; scale ``1 / sqrt(2 d)``) and attending with
that core, so its output is mmdet's plus the terms:

.. math::

    z_q = \\sum_j \\mathrm{softmax}_j\\big(
          [c_q, s_q]_h [k_j, p_j]_h^T / \\sqrt{2 d} + B_h[q, j] + m_j\\big)
          v_j
"""
from typing import Optional, Sequence, Tuple

import torch
from mmdet.models.layers.transformer.utils import ConditionalAttention
from mmdet.registry import MODELS
from torch import Tensor

from ..common.arg_checks import check_choice, check_grid
from ..terms.relative_term import RelativeTerm
from .core import PEAttention

#: backends of the core that run terms of a non-grid query side
#: (FlexAttention takes per-axis buckets of a query grid; ``'fused'`` is the
#: Triton kernel on CUDA, on CPU it falls back to ``'chunked'``)
CROSS_IMPL_CHOICES = ('auto', 'explicit', 'chunked', 'sdpa', 'fused')


class CrossPEAttention(PEAttention):
    """The attention core for queries against an ``(h, w)`` key grid.

    No terms of its own: the relative terms come with each call
    (``attend(..., terms=...)``), e.g. a
    :class:`~mmpe.models.layers.box.box_rpb.AxisBiasTerm`. Holds no
    parameters.

    Args:
        embed_dims (int): Channels of q / k (all heads).
        num_heads (int): Heads.
        attn_drop (float): Dropout on the probabilities. Defaults to 0.
        attn_impl (str): One of :data:`CROSS_IMPL_CHOICES` (see
            :class:`PEAttention`; ``'chunked'`` keeps no ``(B, H, Q, L)``
            tensor for the backward). Defaults to 'auto'.
        chunk_size (int, optional): Query rows per chunk. Defaults to None.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 attn_drop: float = 0.,
                 attn_impl: str = 'auto',
                 chunk_size: Optional[int] = None) -> None:
        check_choice('attn_impl', attn_impl, CROSS_IMPL_CHOICES)
        super().__init__(
            embed_dims,
            num_heads,
            attn_drop=attn_drop,
            attn_impl=attn_impl,
            chunk_size=chunk_size)

    @property
    def has_relative_terms(self) -> bool:
        """Always: the calls bring their terms."""
        return True

    def _check_grid(self, q: Tensor, k: Tensor,
                    spatial_shape: Optional[Sequence[int]]) -> Tuple[int, int]:
        if spatial_shape is None:
            raise ValueError(
                f'{type(self).__name__} needs `spatial_shape=(height, '
                'width)` of the key grid; got None')
        height, width = check_grid(*spatial_shape)
        if k.shape[2] != height * width:
            raise ValueError(
                f'`spatial_shape` {(height, width)} means {height * width} '
                f'keys, but key has {k.shape[2]}')
        return height, width


@MODELS.register_module()
class BiasedConditionalAttention(ConditionalAttention):
    """mmdet's ``ConditionalAttention`` (cross-attention form) with relative
    terms in its logits, through :class:`CrossPEAttention`.

    Same parameters (names and shapes) as mmdet's module, so a Conditional
    DETR / DAB-DETR checkpoint loads into it unchanged; with no terms the
    output is mmdet's up to float summation order.

    Args:
        *args, **kwargs: mmdet's ``ConditionalAttention`` arguments
            (``cross_attn`` must be True).
        attn_impl (str): Backend of the core, one of
            :data:`CROSS_IMPL_CHOICES`. Defaults to 'auto'.
        chunk_size (int, optional): Query rows per chunk. Defaults to None.
    """

    def __init__(self,
                 *args,
                 attn_impl: str = 'auto',
                 chunk_size: Optional[int] = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not self.cross_attn:
            raise ValueError(
                'BiasedConditionalAttention is the cross-attention form; '
                'got cross_attn=False')
        # q / k: content and spatial halves per head, 2 * embed_dims
        self.core = CrossPEAttention(
            2 * self.embed_dims,
            self.num_heads,
            attn_drop=self.attn_drop.p,
            attn_impl=attn_impl,
            chunk_size=chunk_size)

    def forward(self,
                query: Tensor,
                key: Tensor,
                query_pos: Optional[Tensor] = None,
                ref_sine_embed: Optional[Tensor] = None,
                key_pos: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None,
                is_first: bool = False,
                spatial_shape: Optional[Sequence[int]] = None,
                terms: Sequence[RelativeTerm] = ()) -> Tensor:
        """mmdet's cross-attention plus ``terms``, with the residual.

        Args:
            query (Tensor): (bs, num_queries, embed_dims).
            key (Tensor): (bs, h * w, embed_dims).
            query_pos (Tensor): (bs, num_queries, embed_dims); read in the
                first layer (or with ``keep_query_pos``).
            ref_sine_embed (Tensor): (bs, num_queries, embed_dims), sine
                encoding of the reference points.
            key_pos (Tensor): (bs, h * w, embed_dims).
            attn_mask (Tensor, optional): (num_queries, h * w).
            key_padding_mask (Tensor, optional): (bs, h * w) bool.
            is_first (bool): Whether this is the first decoder layer.
            spatial_shape (tuple[int, int]): The key grid ``(h, w)``.
            terms (list[RelativeTerm]): Logit terms of this call.

        Returns:
            Tensor: (bs, num_queries, embed_dims).
        """
        q_content = self.qcontent_proj(query)
        k_content = self.kcontent_proj(key)
        v = self.v_proj(key)
        bs, nq, c = q_content.shape
        hw = k_content.shape[1]
        heads = self.num_heads
        k_pos = self.kpos_proj(key_pos)
        if is_first or self.keep_query_pos:
            q = q_content + self.qpos_proj(query_pos)
            k = k_content + k_pos
        else:
            q, k = q_content, k_content
        sine = self.qpos_sine_proj(ref_sine_embed)
        # per head: content then spatial part, (bs, n, H, 2d) -> (bs, H, n, 2d)
        q = torch.cat([
            q.view(bs, nq, heads, c // heads),
            sine.view(bs, nq, heads, c // heads)
        ], 3).transpose(1, 2)
        k = torch.cat([k.view(bs, hw, heads, c // heads),
                       k_pos.view(bs, hw, heads, c // heads)],
                      3).transpose(1, 2)
        v = v.view(bs, hw, heads, c // heads).transpose(1, 2)  # d channels
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.bool()
        out = self.core.attend(q, k, v, spatial_shape, key_padding_mask,
                               attn_mask, terms=terms)
        out = self.out_proj(self.core.merge_heads(out))
        return query + self.proj_drop(out)
