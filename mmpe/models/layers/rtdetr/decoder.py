"""RT-DETR's decoder: self-attention, deformable cross-attention v2 and
FFN per layer, each layer refining the previous layer's boxes.

Released code: ``rtdetrv2_pytorch/src/zoo/rtdetr/rtdetrv2_decoder.py``,
``TransformerDecoderLayer`` and ``TransformerDecoder`` (post-norm layers;
the query position is an MLP of the layer's input box; box refinement
``b_i = sigmoid(f_i(x_i) + logit(b_{i-1}))`` with ``b_{i-1}`` detached as
the layer's input). In training every layer's scores and boxes are returned
and a layer's box keeps the gradient of the previous layer's (DINO's "look
forward twice": ``sigmoid(f_i(x_i) + logit(b_{i-1}))`` with ``b_{i-1}`` not
detached, for layers after the first); in inference the decoder stops at
``eval_idx`` and returns that layer's only.

Boxes are normalised to each image; ``valid_ratios`` (each image's size
over the padded input's) turn them into the padded maps' coordinates for
the sampling, so an image attends to the same cells alone or in a padded
batch.
"""
import copy
from typing import Optional, Sequence, Tuple

import torch
from mmdet.models.layers.transformer import inverse_sigmoid
from torch import Tensor, nn

from ....utils.arg_checks import check_int
from ..common.arg_checks import check_choice
from .deform_attn import MSDeformableAttentionV2

#: the FFN's activations (the released ``get_activation`` names in use)
ACTIVATIONS = {'relu': nn.ReLU, 'gelu': nn.GELU, 'silu': nn.SiLU}


class RTDETRDecoderLayer(nn.Module):
    """One post-norm decoder layer (names as released: ``self_attn``,
    ``norm1``, ``cross_attn``, ``norm2``, ``linear1``, ``linear2``,
    ``norm3``).

    Args:
        embed_dims (int): Channels. Defaults to 256.
        num_heads (int): Heads of both attentions. Defaults to 8.
        ffn_dims (int): FFN hidden channels. Defaults to 1024.
        dropout (float): Defaults to 0.
        activation (str): FFN activation, ``'relu'``, ``'gelu'`` or
            ``'silu'``. Defaults to ``'relu'``.
        num_levels (int): Defaults to 3.
        num_points (int | list[int]): Per level. Defaults to 4.
        cross_attn_method (str): ``'default'`` or ``'discrete'``.
    """

    def __init__(self,
                 embed_dims: int = 256,
                 num_heads: int = 8,
                 ffn_dims: int = 1024,
                 dropout: float = 0.0,
                 activation: str = 'relu',
                 num_levels: int = 3,
                 num_points=4,
                 cross_attn_method: str = 'default') -> None:
        super().__init__()
        check_choice('activation', activation, tuple(ACTIVATIONS))
        self.self_attn = nn.MultiheadAttention(
            embed_dims, num_heads, dropout=dropout, batch_first=True)
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(embed_dims)
        self.cross_attn = MSDeformableAttentionV2(
            embed_dims, num_heads, num_levels, num_points,
            method=cross_attn_method)
        self.dropout2 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(embed_dims)
        self.linear1 = nn.Linear(embed_dims, ffn_dims)
        self.activation = ACTIVATIONS[activation]()
        self.dropout3 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(ffn_dims, embed_dims)
        self.dropout4 = nn.Dropout(dropout)
        self.norm3 = nn.LayerNorm(embed_dims)
        nn.init.xavier_uniform_(self.linear1.weight)
        nn.init.xavier_uniform_(self.linear2.weight)

    def forward(self,
                query: Tensor,
                reference_boxes: Tensor,
                memory: Tensor,
                spatial_shapes: Sequence[Tuple[int, int]],
                attn_mask: Optional[Tensor] = None,
                memory_mask: Optional[Tensor] = None,
                query_pos: Optional[Tensor] = None) -> Tensor:
        """Args:
            query (Tensor): ``(B, Q, C)``.
            reference_boxes (Tensor): ``(B, Q, 1, 4)`` in the padded maps'
                coordinates.
            memory (Tensor): ``(B, Lv, C)``.
            spatial_shapes (sequence[tuple[int, int]]): per level.
            attn_mask (Tensor, optional): ``(Q, Q)`` bool, True: blocked.
            memory_mask (Tensor, optional): ``(B, Lv)`` bool, True: valid.
            query_pos (Tensor, optional): ``(B, Q, C)``.

        Returns:
            Tensor: ``(B, Q, C)``.
        """
        q = k = query if query_pos is None else query + query_pos
        out = self.self_attn(
            q, k, value=query, attn_mask=attn_mask, need_weights=False)[0]
        query = self.norm1(query + self.dropout1(out))
        q = query if query_pos is None else query + query_pos
        out = self.cross_attn(q, reference_boxes, memory, spatial_shapes,
                              memory_mask)
        query = self.norm2(query + self.dropout2(out))
        out = self.linear2(self.dropout3(self.activation(
            self.linear1(query))))
        return self.norm3(query + self.dropout4(out))


class RTDETRDecoder(nn.Module):
    """``num_layers`` copies of one :class:`RTDETRDecoderLayer` (names as
    released: ``layers.<i>``) with iterative box refinement.

    Args:
        layer (RTDETRDecoderLayer): The layer to copy.
        num_layers (int): Defaults to 6.
        eval_idx (int): The layer whose output inference returns (negative:
            from the end). Defaults to -1.
    """

    def __init__(self,
                 layer: RTDETRDecoderLayer,
                 num_layers: int = 6,
                 eval_idx: int = -1) -> None:
        super().__init__()
        check_int('num_layers', num_layers, 1)
        if not -num_layers <= eval_idx < num_layers:
            raise ValueError(f'`eval_idx` {eval_idx} is not a layer of '
                             f'{num_layers} (choose -{num_layers}..'
                             f'{num_layers - 1})')
        self.layers = nn.ModuleList(
            [copy.deepcopy(layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.eval_idx = eval_idx % num_layers

    def forward(self,
                query: Tensor,
                ref_unact: Tensor,
                memory: Tensor,
                spatial_shapes: Sequence[Tuple[int, int]],
                bbox_head: nn.ModuleList,
                score_head: nn.ModuleList,
                query_pos_head: nn.Module,
                attn_mask: Optional[Tensor] = None,
                memory_mask: Optional[Tensor] = None,
                valid_ratios: Optional[Tensor] = None
                ) -> Tuple[Tensor, Tensor]:
        """Run the layers from the selected queries.

        Args:
            query (Tensor): ``(B, Q, C)`` initial content.
            ref_unact (Tensor): ``(B, Q, 4)`` initial boxes as logits.
            memory (Tensor): ``(B, Lv, C)``.
            spatial_shapes (sequence[tuple[int, int]]): per level.
            bbox_head (nn.ModuleList): per layer, features -> box deltas.
            score_head (nn.ModuleList): per layer, features -> class logits.
            query_pos_head (nn.Module): box ``(B, Q, 4)`` -> ``(B, Q, C)``.
            attn_mask (Tensor, optional): ``(Q, Q)`` self-attention mask.
            memory_mask (Tensor, optional): ``(B, Lv)``, True: valid.
            valid_ratios (Tensor, optional): ``(B, 2)`` each image's
                ``(width, height)`` over the padded input's. None: 1.

        Returns:
            tuple[Tensor, Tensor]: boxes ``(N, B, Q, 4)`` (``(cx, cy, w,
            h)`` normalised to each image) and logits ``(N, B, Q, K)``;
            ``N`` = all layers in training, 1 (layer ``eval_idx``) else.
        """
        scale = None
        if valid_ratios is not None:
            # (B, 1, 1, 4): image-normalised boxes -> padded-map coordinates
            scale = valid_ratios.repeat(1, 2)[:, None, None]
        boxes, logits = [], []
        ref = ref_unact.sigmoid()
        ref_detached = ref
        for i, layer in enumerate(self.layers):
            ref_input = ref_detached.unsqueeze(2)
            if scale is not None:
                ref_input = ref_input * scale
            query_pos = query_pos_head(ref_detached)
            query = layer(query, ref_input, memory, spatial_shapes,
                          attn_mask, memory_mask, query_pos)
            delta = bbox_head[i](query)
            new_ref = (delta + inverse_sigmoid(ref_detached)).sigmoid()
            if self.training:
                logits.append(score_head[i](query))
                boxes.append(new_ref if i == 0 else (
                    delta + inverse_sigmoid(ref)).sigmoid())
            elif i == self.eval_idx:
                logits.append(score_head[i](query))
                boxes.append(new_ref)
                break
            ref = new_ref
            ref_detached = new_ref.detach()
        return torch.stack(boxes), torch.stack(logits)
