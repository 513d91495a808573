"""RT-DETR's head: everything after the hybrid encoder.

Lv et al., "RT-DETRv2" (2024) on Zhao et al., "DETRs Beat YOLOs on
Real-time Object Detection" (RT-DETR, CVPR 2024, Sec. 4.3-4.4). Released
code: ``rtdetrv2_pytorch/src/zoo/rtdetr/rtdetrv2_decoder.py``
(``RTDETRTransformerv2``; parameter names kept, so a released state dict
maps by its prefix: :mod:`mmpe.models.utils.rtdetr_decoder_keys`),
``rtdetrv2_criterion.py`` / ``matcher.py`` (the losses,
:class:`~mmpe.models.dense_heads.rtdetr_loss.RTDETRLossMixin`) and
``rtdetr_postprocessor.py`` (:meth:`RTDETRHead.predict`).

The steps, as :class:`mmpe.models.detectors.RTDETR` calls them:

1. :meth:`flatten_levels`: a 1x1 conv + BN per encoder level (3x3 stride-2
   ones for extra levels), flattened to the memory ``(B, L, C)``;
2. :meth:`select_queries`: IoU-aware query selection: the memory of valid
   anchors (:func:`~mmpe.models.layers.rtdetr.rtdetr_anchors`) through
   ``enc_output``, class logits and box deltas on the anchors, the top
   ``num_queries`` cells by their best class logit (``'default'``) or by
   one class-agnostic logit (``'agnostic'``) become the decoder's queries
   (content detached, as released, unless ``learn_query_content``);
3. the decoder (:class:`~mmpe.models.layers.rtdetr.RTDETRDecoder`) with
   the per-layer ``dec_score_head`` / ``dec_bbox_head``, denoising queries
   first in training;
4. :meth:`loss` / :meth:`predict`.
"""
import math
from collections import OrderedDict
from typing import List, Optional, Sequence, Tuple, Union

import torch
from mmdet.models.layers.transformer import MLP
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy
from mmdet.utils import InstanceList, OptConfigType
from mmengine.model import BaseModule
from mmengine.structures import InstanceData
from torch import Tensor, nn

from ...utils.arg_checks import check_int
from ..layers import (DenoisingGroups, RTDETRDecoder, RTDETRDecoderLayer,
                      contrastive_denoising_groups, is_tracing,
                      rtdetr_anchors)
from .rtdetr_loss import RTDETRLossMixin

#: how the encoder's cells are ranked for the queries
QUERY_SELECT_METHODS = ('default', 'agnostic')


@MODELS.register_module()
class RTDETRHead(RTDETRLossMixin, BaseModule):
    """RT-DETRv2's decoder side, losses and post-processing.

    Args:
        num_classes (int): Classes. Defaults to 80.
        embed_dims (int): Channels (``hidden_dim``). Defaults to 256.
        num_queries (int): Defaults to 300.
        in_channels (sequence[int]): Channels of the encoder's levels
            (``feat_channels``). Defaults to (256, 256, 256).
        num_levels (int): Levels of the cross-attention (more than the
            encoder gives: extra 3x3 stride-2 convs). Defaults to 3.
        num_points (int | list[int]): Sampling points per head and level.
            Defaults to 4.
        num_heads (int): Defaults to 8.
        num_layers (int): Decoder layers. Defaults to 6.
        ffn_dims (int): Defaults to 1024.
        dropout (float): Defaults to 0.
        activation (str): Decoder FFN's. Defaults to ``'relu'``.
        num_denoising (int): Most denoising queries (0: none). Defaults to
            100.
        label_noise_ratio (float): Defaults to 0.5.
        box_noise_scale (float): Defaults to 1.0.
        learn_query_content (bool): Learned query content instead of the
            selected memory. Defaults to False.
        eval_idx (int): Decoder layer of inference. Defaults to -1.
        anchor_eps (float): Margin of valid anchors. Defaults to 1e-2.
        cross_attn_method (str): ``'default'`` or ``'discrete'``.
        query_select_method (str): ``'default'`` or ``'agnostic'``.
        loss_weights (dict): ``loss_vfl``, ``loss_bbox``, ``loss_giou``.
            Defaults to the released 1, 5, 2.
        vfl_alpha (float): Defaults to 0.75.
        vfl_gamma (float): Defaults to 2.0.
        train_cfg (dict): ``assigner`` (the Hungarian matcher with the
            released costs by default).
        test_cfg (dict): ``max_per_img`` (the released 300 by default).
        init_cfg (dict, optional): Defaults to None.
    """

    def __init__(self,
                 num_classes: int = 80,
                 embed_dims: int = 256,
                 num_queries: int = 300,
                 in_channels: Sequence[int] = (256, 256, 256),
                 num_levels: int = 3,
                 num_points: Union[int, List[int]] = 4,
                 num_heads: int = 8,
                 num_layers: int = 6,
                 ffn_dims: int = 1024,
                 dropout: float = 0.0,
                 activation: str = 'relu',
                 num_denoising: int = 100,
                 label_noise_ratio: float = 0.5,
                 box_noise_scale: float = 1.0,
                 learn_query_content: bool = False,
                 eval_idx: int = -1,
                 anchor_eps: float = 1e-2,
                 cross_attn_method: str = 'default',
                 query_select_method: str = 'default',
                 loss_weights: Optional[dict] = None,
                 vfl_alpha: float = 0.75,
                 vfl_gamma: float = 2.0,
                 train_cfg: OptConfigType = None,
                 test_cfg: OptConfigType = None,
                 init_cfg: OptConfigType = None) -> None:
        super().__init__(init_cfg=init_cfg)
        check_int('num_classes', num_classes, 1)
        check_int('num_queries', num_queries, 1)
        check_int('num_denoising', num_denoising, 0)
        if query_select_method not in QUERY_SELECT_METHODS:
            raise ValueError(
                f'Unsupported `query_select_method` {query_select_method!r}'
                f', please choose from {QUERY_SELECT_METHODS}')
        if len(in_channels) > num_levels:
            raise ValueError(f'{len(in_channels)} `in_channels` for '
                             f'`num_levels` {num_levels}: give at most one '
                             'channel count per level')
        self.num_classes = num_classes
        self.embed_dims = embed_dims
        self.num_queries = num_queries
        self.num_levels = num_levels
        self.num_in_levels = len(in_channels)
        self.num_denoising = num_denoising
        self.label_noise_ratio = label_noise_ratio
        self.box_noise_scale = box_noise_scale
        self.learn_query_content = learn_query_content
        self.anchor_eps = anchor_eps
        self.query_select_method = query_select_method
        self.test_cfg = dict(max_per_img=300)
        self.test_cfg.update(test_cfg or {})
        self._init_loss(train_cfg, loss_weights, vfl_alpha, vfl_gamma)

        self.input_proj = nn.ModuleList()
        for channels in in_channels:
            self.input_proj.append(self._proj(channels, 1, 1, 0))
        channels = in_channels[-1]
        for _ in range(num_levels - len(in_channels)):
            self.input_proj.append(self._proj(channels, 3, 2, 1))
            channels = embed_dims
        layer = RTDETRDecoderLayer(embed_dims, num_heads, ffn_dims, dropout,
                                   activation, num_levels, num_points,
                                   cross_attn_method)
        self.decoder = RTDETRDecoder(layer, num_layers, eval_idx)
        if num_denoising > 0:
            self.denoising_class_embed = nn.Embedding(
                num_classes + 1, embed_dims, padding_idx=num_classes)
        if learn_query_content:
            self.tgt_embed = nn.Embedding(num_queries, embed_dims)
        self.query_pos_head = MLP(4, 2 * embed_dims, embed_dims, 2)
        self.enc_output = nn.Sequential(
            OrderedDict([('proj', nn.Linear(embed_dims, embed_dims)),
                         ('norm', nn.LayerNorm(embed_dims))]))
        enc_classes = 1 if query_select_method == 'agnostic' else num_classes
        self.enc_score_head = nn.Linear(embed_dims, enc_classes)
        self.enc_bbox_head = MLP(embed_dims, embed_dims, 4, 3)
        self.dec_score_head = nn.ModuleList(
            [nn.Linear(embed_dims, num_classes) for _ in range(num_layers)])
        self.dec_bbox_head = nn.ModuleList(
            [MLP(embed_dims, embed_dims, 4, 3) for _ in range(num_layers)])
        self._reset_parameters()

    def _proj(self, channels: int, kernel: int, stride: int,
              padding: int) -> nn.Sequential:
        conv = nn.Conv2d(channels, self.embed_dims, kernel, stride, padding,
                         bias=False)
        return nn.Sequential(
            OrderedDict([('conv', conv),
                         ('norm', nn.BatchNorm2d(self.embed_dims))]))

    def _reset_parameters(self) -> None:
        """The released initialisation: score biases at prior 0.01, last
        box layers zero, Xavier projections, N(0, 1) label embeddings."""
        prior = -math.log((1 - 0.01) / 0.01)
        nn.init.constant_(self.enc_score_head.bias, prior)
        for score, box in [(self.enc_score_head, self.enc_bbox_head),
                           *zip(self.dec_score_head, self.dec_bbox_head)]:
            nn.init.constant_(score.bias, prior)
            nn.init.zeros_(box.layers[-1].weight)
            nn.init.zeros_(box.layers[-1].bias)
        nn.init.xavier_uniform_(self.enc_output.proj.weight)
        if self.learn_query_content:
            nn.init.xavier_uniform_(self.tgt_embed.weight)
        for linear in self.query_pos_head.layers:
            nn.init.xavier_uniform_(linear.weight)
        for proj in self.input_proj:
            nn.init.xavier_uniform_(proj.conv.weight)
        if self.num_denoising > 0:
            with torch.no_grad():
                nn.init.normal_(self.denoising_class_embed.weight[:-1])

    def init_weights(self) -> None:
        """The released initialisation (unless ``init_cfg`` says other)."""
        super().init_weights()
        if self.init_cfg is None:
            self._reset_parameters()

    def flatten_levels(self, feats: Sequence[Tensor]
                       ) -> Tuple[Tensor, List[Tuple[int, int]]]:
        """Project the encoder's levels and flatten them.

        Args:
            feats (sequence[Tensor]): ``(B, C_l, H_l, W_l)`` per level.

        Returns:
            tuple: the memory ``(B, L, C)`` (levels row-major, concatenated)
            and the levels' ``(H_l, W_l)``.
        """
        if len(feats) != self.num_in_levels:
            raise ValueError(
                f'{len(feats)} feature maps for a head built for '
                f'{self.num_in_levels} (`in_channels`)')
        maps = [proj(x) for proj, x in zip(self.input_proj, feats)]
        for i in range(len(feats), self.num_levels):
            maps.append(self.input_proj[i](feats[-1] if i == len(feats) else
                                           maps[-1]))
        shapes = [tuple(x.shape[-2:]) for x in maps]
        # (B, C, H, W) -> (B, H * W, C) per level, concatenated
        memory = torch.cat([x.flatten(2).transpose(1, 2) for x in maps], 1)
        return memory, shapes

    def select_queries(self,
                       memory: Tensor,
                       spatial_shapes: Sequence[Tuple[int, int]],
                       valid_ratios: Optional[Tensor] = None,
                       memory_mask: Optional[Tensor] = None
                       ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """IoU-aware query selection (see the module doc).

        Args:
            memory (Tensor): ``(B, L, C)``.
            spatial_shapes (sequence[tuple[int, int]]): per level.
            valid_ratios (Tensor, optional): ``(B, 2)`` each image's
                ``(width, height)`` over the padded input's.
            memory_mask (Tensor, optional): ``(B, L)`` bool, True on the
                cells of each image (not padding): only they are selected
                while there are enough. None: all cells.

        Returns:
            tuple[Tensor, Tensor, Tensor, Tensor]: query content ``(B, Q,
            C)``, initial boxes as logits ``(B, Q, 4)`` (detached), and the
            selected cells' logits ``(B, Q, K_enc)`` and boxes ``(B, Q,
            4)`` (sigmoid) for the encoder's loss.
        """
        if not is_tracing() and memory.shape[1] < self.num_queries:
            raise ValueError(
                f'the input gives {memory.shape[1]} cells on levels '
                f'{list(spatial_shapes)}, fewer than `num_queries` '
                f'{self.num_queries}: use a larger input or fewer queries')
        # float32 whatever the memory's type, as released (its sum with
        # the box deltas is float32 under autocast too)
        anchors, valid = rtdetr_anchors(
            spatial_shapes,
            valid_ratios,
            eps=self.anchor_eps,
            device=memory.device)
        memory = valid.to(memory.dtype) * memory
        memory = self.enc_output(memory)
        logits = self.enc_score_head(memory)
        coords = self.enc_bbox_head(memory) + anchors
        rank = logits.max(-1).values
        if memory_mask is not None:
            # padded cells hold no image: never a query before a real cell
            rank = rank.masked_fill(~memory_mask, float('-inf'))
        _, index = torch.topk(rank, self.num_queries, dim=-1)

        def take(x: Tensor) -> Tensor:
            return x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))

        coords, logits, memory = take(coords), take(logits), take(memory)
        if self.learn_query_content:
            content = self.tgt_embed.weight[None].expand(
                memory.shape[0], -1, -1)
        else:
            content = memory.detach()
        return content, coords.detach(), logits, coords.sigmoid()

    def forward(self, all_logits: Tensor, all_boxes: Tensor, *args,
                **kwargs) -> Tuple[Tensor, Tensor]:
        """The decoder's per-layer logits ``(N, B, Q, K)`` and boxes
        ``(N, B, Q, 4)`` (what the detector's tensor mode returns)."""
        return all_logits, all_boxes

    def predict(self,
                all_logits: Tensor,
                all_boxes: Tensor,
                batch_data_samples: SampleList,
                rescale: bool = True,
                **kwargs) -> InstanceList:
        """Top-k over all queries' and classes' sigmoid scores.

        Released code: ``rtdetr_postprocessor.py`` (``use_focal_loss``):
        the ``max_per_img`` best (query, class) pairs; boxes to each image's
        ``img_shape``, clipped to it, and with ``rescale`` divided by its
        ``scale_factor`` (as mmdet's DETR heads do; the released code
        multiplies by the original size instead and does not clip).

        Args:
            all_logits (Tensor): ``(N, B, Q, K)``; the last layer is used.
            all_boxes (Tensor): ``(N, B, Q, 4)``, normalised ``(cx, cy, w,
                h)``.
            batch_data_samples (list[DetDataSample]): ``img_shape`` and,
                with ``rescale``, ``scale_factor``.
            rescale (bool): Defaults to True.

        Returns:
            list[InstanceData]: ``scores``, ``labels``, ``bboxes`` per image.
        """
        logits, boxes = all_logits[-1], all_boxes[-1]
        K = logits.shape[-1]
        k = min(self.test_cfg['max_per_img'], logits.shape[1] * K)
        scores, index = logits.sigmoid().flatten(1).topk(k, dim=-1)
        labels = index % K
        boxes = boxes.gather(1, (index // K).unsqueeze(-1).expand(-1, -1, 4))
        results = []
        for i, sample in enumerate(batch_data_samples):
            h, w = sample.metainfo['img_shape'][:2]
            xyxy = bbox_cxcywh_to_xyxy(boxes[i]) * boxes.new_tensor(
                [w, h, w, h])
            xyxy[:, 0::2] = xyxy[:, 0::2].clamp(min=0, max=w)
            xyxy[:, 1::2] = xyxy[:, 1::2].clamp(min=0, max=h)
            if rescale:
                factor = xyxy.new_tensor(sample.metainfo['scale_factor'])
                xyxy = xyxy / factor.repeat(2)
            results.append(
                InstanceData(scores=scores[i], labels=labels[i], bboxes=xyxy))
        return results

    def denoising_groups(self, batch_data_samples: SampleList
                         ) -> Optional[DenoisingGroups]:
        """The batch's denoising queries from its ground truth (training
        with ``num_denoising > 0``), else None."""
        if not (self.training and self.num_denoising > 0):
            return None
        labels, boxes = [], []
        for sample in batch_data_samples:
            labels.append(sample.gt_instances.labels)
            boxes.append(self.normalised_gt(sample))
        return contrastive_denoising_groups(
            labels, boxes, self.num_classes, self.num_queries,
            self.denoising_class_embed, self.num_denoising,
            self.label_noise_ratio, self.box_noise_scale)
