"""RT-DETR's contrastive denoising groups (from DINO, Zhang et al., ICLR
2023, Sec. 3.3), as the released code builds them.

Released code: ``rtdetrv2_pytorch/src/zoo/rtdetr/denoising.py``,
``get_contrastive_denoising_training_group``. With ``n`` the most boxes of
an image in the batch, ``G = max(1, num_denoising // n)`` groups of ``2 n``
queries each: the ground truth boxes twice, a positive copy (corners moved
by less than half the box side times ``box_noise_scale``) and a negative
one (moved by between one and two such halves); each label flipped to a
random class with probability ``label_noise_ratio / 2``. A query of one
group sees no query of another; the matching queries see no denoising
query. A batch without boxes gets one group of one dummy query (a box at
the centre, no positive), so every rank runs the same modules.

The random draws are made in the released code's order and shapes (label
flips ``rand``, new labels ``randint``, corner signs ``randint``, corner
magnitudes ``rand``, all on the boxes' device): seeded alike, both give the
same groups.
"""
from dataclasses import dataclass
from typing import List, Sequence

import torch
from mmdet.models.layers.transformer import inverse_sigmoid
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy, bbox_xyxy_to_cxcywh
from torch import Tensor, nn


@dataclass
class DenoisingGroups:
    """One batch's denoising queries.

    Attributes:
        content (Tensor): ``(B, D, C)``: the noised labels' embeddings.
        boxes_unact (Tensor): ``(B, D, 4)``: the noised boxes as logits.
        attn_mask (Tensor): ``(D + Q, D + Q)`` bool, True where a query may
            not attend (denoising queries first).
        positive_idx (list[Tensor]): per image, the positive queries'
            indices (group by group, box by box).
        num_groups (int): ``G``.
        num_denoising (int): ``D = 2 n G``.
    """
    content: Tensor
    boxes_unact: Tensor
    attn_mask: Tensor
    positive_idx: List[Tensor]
    num_groups: int
    num_denoising: int


def contrastive_denoising_groups(labels: Sequence[Tensor],
                                 boxes: Sequence[Tensor],
                                 num_classes: int,
                                 num_queries: int,
                                 class_embed: nn.Embedding,
                                 num_denoising: int = 100,
                                 label_noise_ratio: float = 0.5,
                                 box_noise_scale: float = 1.0
                                 ) -> DenoisingGroups:
    """Build one batch's denoising groups (see the module doc).

    Args:
        labels (sequence[Tensor]): per image ``(n_i,)`` class indices.
        boxes (sequence[Tensor]): per image ``(n_i, 4)`` boxes ``(cx, cy,
            w, h)`` normalised to the image.
        num_classes (int): Classes; index ``num_classes`` is the padding
            label (``class_embed``'s ``padding_idx``).
        num_queries (int): Matching queries after the denoising ones.
        class_embed (nn.Embedding): ``num_classes + 1`` label embeddings.
        num_denoising (int): The most denoising queries. Defaults to 100.
        label_noise_ratio (float): Defaults to 0.5.
        box_noise_scale (float): Defaults to 1.0.

    Returns:
        DenoisingGroups: the queries, the attention mask and the positives.
    """
    counts = [len(x) for x in labels]
    device = boxes[0].device
    bs = len(counts)
    most = max(counts)
    empty = most == 0
    if empty:
        most, groups = 1, 1
    else:
        groups = max(1, num_denoising // most)
    query_class = torch.full([bs, most],
                             num_classes,
                             dtype=torch.int32,
                             device=device)
    query_box = torch.zeros([bs, most, 4], device=device)
    real = torch.zeros([bs, most], dtype=torch.bool, device=device)
    if empty:
        # a valid dummy box, so the noise and the logits stay finite
        query_box[..., :2] = 0.5
        query_box[..., 2:] = 0.1
    for i, n in enumerate(counts):
        if n:
            query_class[i, :n] = labels[i]
            query_box[i, :n] = boxes[i]
            real[i, :n] = True
    # every group: the boxes once as positives, once as negatives
    query_class = query_class.tile([1, 2 * groups])
    query_box = query_box.tile([1, 2 * groups, 1])
    real = real.tile([1, 2 * groups])
    negative = torch.zeros([bs, most * 2, 1], device=device)
    negative[:, most:] = 1
    negative = negative.tile([1, groups, 1])
    positive = (1 - negative).squeeze(-1) * real
    positive_idx = torch.nonzero(positive)[:, 1]
    positive_idx = list(torch.split(positive_idx,
                                    [n * groups for n in counts]))
    total = most * 2 * groups

    if label_noise_ratio > 0:
        flip = torch.rand_like(query_class, dtype=torch.float)
        flip = flip < label_noise_ratio * 0.5
        new_label = torch.randint_like(
            flip, 0, num_classes, dtype=query_class.dtype)
        query_class = torch.where(flip & real, new_label, query_class)
    if box_noise_scale > 0:
        corners = bbox_cxcywh_to_xyxy(query_box)
        half = torch.tile(query_box[..., 2:] * 0.5, [1, 1, 2])
        half = half * box_noise_scale
        sign = torch.randint_like(query_box, 0, 2) * 2.0 - 1.0
        magnitude = torch.rand_like(query_box)
        # negatives move by [1, 2) halves, positives by [0, 1)
        magnitude = (magnitude + 1.0) * negative + magnitude * (1 - negative)
        corners = (corners + sign * magnitude * half).clip(min=0.0, max=1.0)
        query_box = bbox_xyxy_to_cxcywh(corners)
    boxes_unact = inverse_sigmoid(query_box)
    content = class_embed(query_class)

    size = total + num_queries
    group = torch.arange(total, device=device) // (2 * most)
    attn_mask = torch.zeros([size, size], dtype=torch.bool, device=device)
    attn_mask[:total, :total] = group[:, None] != group[None, :]
    attn_mask[total:, :total] = True
    return DenoisingGroups(content, boxes_unact, attn_mask, positive_idx,
                           groups, total)
