"""RT-DETRv2's losses: VFL + L1 + GIoU after Hungarian matching, on the
last layer, every earlier layer, the selected encoder cells and the
denoising groups.

Released code: ``rtdetrv2_pytorch/src/zoo/rtdetr/rtdetrv2_criterion.py``
(``RTDETRCriterionv2``, losses ``['vfl', 'boxes']``, weights ``loss_vfl``
1, ``loss_bbox`` 5, ``loss_giou`` 2, VFL ``alpha`` 0.75, ``gamma`` 2) and
``matcher.py`` (``HungarianMatcher``, costs: focal class cost ``alpha``
0.25, ``gamma`` 2, ``eps`` 1e-8, weight 2; L1 of normalised ``(cx, cy, w,
h)``, weight 5; ``-GIoU``, weight 2). The matching is mmdet's
``HungarianAssigner`` with ``FocalLossCost(eps=1e-8)``, ``BBoxL1Cost(
box_format='xywh')`` and ``IoUCost(iou_mode='giou')`` fed normalised boxes
with an image shape of ``(1, 1)``: the same sums as the released matcher.

Varifocal loss (Zhang et al., "VarifocalNet", CVPR 2021, Eq. 2, as released):
with ``t`` the one-hot target times the matched box's IoU (detached) and
``p = sigmoid(x)`` (detached),
``L = sum BCE(x, t) (alpha p^gamma (1 - onehot) + t) / num_boxes``. mmdet's
``VarifocalLoss`` weighs a positive whose IoU is 0 as a negative
(``alpha p^gamma``), the released one by 0, so it is written here. GIoU and
IoU are mmdet's ``bbox_overlaps`` (the released formulas). Loss names
follow mmdet's DINO: ``loss_vfl`` (last layer), ``d{i}.loss_vfl`` (layer
``i``), ``enc_loss_vfl``, ``dn_loss_vfl`` / ``d{i}.dn_loss_vfl``; likewise
``loss_bbox`` and ``loss_giou``.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmdet.registry import TASK_UTILS
from mmdet.structures import SampleList
from mmdet.structures.bbox import (bbox_cxcywh_to_xyxy, bbox_overlaps,
                                   bbox_xyxy_to_cxcywh)
from mmdet.utils import reduce_mean
from mmengine.structures import InstanceData
from torch import Tensor

#: the released matcher's costs
DEFAULT_ASSIGNER = dict(
    type='HungarianAssigner',
    match_costs=[
        dict(type='FocalLossCost', weight=2.0, alpha=0.25, gamma=2.0,
             eps=1e-8),
        dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
        dict(type='IoUCost', iou_mode='giou', weight=2.0)
    ])
#: the released loss weights
DEFAULT_LOSS_WEIGHTS = dict(loss_vfl=1.0, loss_bbox=5.0, loss_giou=2.0)
#: (batch index, query index, gt index) of one output's matched pairs
Matches = Tuple[Tensor, Tensor, Tensor]


def _at_least_float32(x: Tensor) -> Tensor:
    """Half / bfloat16 outputs (autocast) to float32 for the losses and
    the matching (scipy takes no bfloat16); float32 / float64 as they are."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class RTDETRLossMixin:
    """The losses of :class:`~mmpe.models.dense_heads.RTDETRHead`."""

    def _init_loss(self, train_cfg: Optional[dict],
                   loss_weights: Optional[dict], vfl_alpha: float,
                   vfl_gamma: float) -> None:
        train_cfg = dict(train_cfg or {})
        self.assigner = TASK_UTILS.build(
            train_cfg.get('assigner', DEFAULT_ASSIGNER))
        weights = dict(DEFAULT_LOSS_WEIGHTS)
        unknown = set(loss_weights or {}) - set(weights)
        if unknown:
            raise ValueError(f'Unsupported `loss_weights` keys '
                             f'{sorted(unknown)}, please choose from '
                             f'{sorted(weights)}')
        weights.update(loss_weights or {})
        self.loss_weights = weights
        self.vfl_alpha = vfl_alpha
        self.vfl_gamma = vfl_gamma

    @staticmethod
    def normalised_gt(sample) -> Tensor:
        """A sample's gt boxes as ``(cx, cy, w, h)`` over its
        ``img_shape``, ``(n, 4)``."""
        h, w = sample.metainfo['img_shape'][:2]
        boxes = sample.gt_instances.bboxes
        boxes = getattr(boxes, 'tensor', boxes)
        return bbox_xyxy_to_cxcywh(boxes / boxes.new_tensor([w, h, w, h]))

    def match(self, logits: Tensor, boxes: Tensor, labels: Sequence[Tensor],
              gt_boxes: Sequence[Tensor]) -> Matches:
        """Hungarian matching of one output to the ground truth.

        Args:
            logits (Tensor): ``(B, Q, K)``.
            boxes (Tensor): ``(B, Q, 4)`` normalised ``(cx, cy, w, h)``.
            labels (sequence[Tensor]): per image ``(n_i,)``.
            gt_boxes (sequence[Tensor]): per image ``(n_i, 4)`` normalised
                ``(cx, cy, w, h)``.

        Returns:
            Matches: batch, query and gt indices of the pairs.
        """
        logits, boxes = _at_least_float32(logits), _at_least_float32(boxes)
        meta = dict(img_shape=(1, 1))
        batch, query, gt = [], [], []
        for i, (lab, gtb) in enumerate(zip(labels, gt_boxes)):
            preds = InstanceData(
                scores=logits[i].detach(),
                bboxes=bbox_cxcywh_to_xyxy(boxes[i].detach()))
            gts = InstanceData(
                labels=lab, bboxes=bbox_cxcywh_to_xyxy(gtb.to(boxes.dtype)))
            result = self.assigner.assign(preds, gts, img_meta=meta)
            q = torch.nonzero(result.gt_inds > 0).flatten()
            batch.append(torch.full_like(q, i))
            query.append(q)
            gt.append(result.gt_inds[q] - 1)
        return torch.cat(batch), torch.cat(query), torch.cat(gt)

    def output_losses(self, logits: Tensor, boxes: Tensor,
                      labels: Sequence[Tensor], gt_boxes: Sequence[Tensor],
                      matches: Matches, num_boxes: float) -> dict:
        """``loss_vfl``, ``loss_bbox``, ``loss_giou`` of one output, weighted.

        Args:
            logits (Tensor): ``(B, Q, K)``.
            boxes (Tensor): ``(B, Q, 4)`` normalised ``(cx, cy, w, h)``.
            labels, gt_boxes: per image, as :meth:`match` takes them.
            matches (Matches): the pairs.
            num_boxes (float): the normaliser.
        """
        logits, boxes = _at_least_float32(logits), _at_least_float32(boxes)
        b, q, g = matches
        offsets = [0]
        for lab in labels[:-1]:
            offsets.append(offsets[-1] + len(lab))
        flat = g + boxes.new_tensor(offsets, dtype=torch.long)[b]
        target_labels = torch.cat(list(labels))[flat]
        target_boxes = torch.cat(list(gt_boxes))[flat].to(boxes.dtype)
        src = boxes[b, q]
        src_xyxy = bbox_cxcywh_to_xyxy(src)
        tgt_xyxy = bbox_cxcywh_to_xyxy(target_boxes)

        ious = bbox_overlaps(
            src_xyxy.detach(), tgt_xyxy, mode='iou', is_aligned=True)
        onehot = torch.zeros_like(logits)
        onehot[b, q, target_labels] = 1
        score = torch.zeros_like(logits)
        score[b, q, target_labels] = ious.to(logits.dtype)
        prob = logits.sigmoid().detach()
        weight = self.vfl_alpha * prob.pow(self.vfl_gamma) * (1 - onehot)
        weight = weight + score
        vfl = F.binary_cross_entropy_with_logits(
            logits, score, weight=weight, reduction='none')
        vfl = vfl.mean(1).sum() * logits.shape[1] / num_boxes

        l1 = F.l1_loss(src, target_boxes, reduction='none').sum() / num_boxes
        giou = bbox_overlaps(
            src_xyxy, tgt_xyxy, mode='giou', is_aligned=True, eps=1e-12)
        giou = (1 - giou).sum() / num_boxes
        w = self.loss_weights
        return dict(
            loss_vfl=vfl * w['loss_vfl'],
            loss_bbox=l1 * w['loss_bbox'],
            loss_giou=giou * w['loss_giou'])

    def loss(self, all_logits: Tensor, all_boxes: Tensor, enc_logits: Tensor,
             enc_boxes: Tensor, dn: Optional[object],
             batch_data_samples: SampleList) -> dict:
        """All the losses of one training batch.

        Args:
            all_logits (Tensor): ``(N, B, D + Q, K)`` every layer's logits
                (the ``D`` denoising queries first).
            all_boxes (Tensor): ``(N, B, D + Q, 4)``.
            enc_logits (Tensor): ``(B, Q, K_enc)`` the selected cells'.
            enc_boxes (Tensor): ``(B, Q, 4)``.
            dn (DenoisingGroups, optional): the batch's groups.
            batch_data_samples (list[DetDataSample]): ``gt_instances``.

        Returns:
            dict[str, Tensor]: the named losses (see the module doc).
        """
        labels = [s.gt_instances.labels for s in batch_data_samples]
        gt_boxes = [self.normalised_gt(s) for s in batch_data_samples]
        num_boxes = all_logits.new_tensor([float(sum(map(len, labels)))])
        num_boxes = reduce_mean(num_boxes).clamp(min=1).item()
        if dn is not None:
            dn_logits = all_logits[:, :, :dn.num_denoising]
            dn_boxes = all_boxes[:, :, :dn.num_denoising]
            all_logits = all_logits[:, :, dn.num_denoising:]
            all_boxes = all_boxes[:, :, dn.num_denoising:]
        losses = {}
        last = len(all_logits) - 1
        for i, (logits, boxes) in enumerate(zip(all_logits, all_boxes)):
            matches = self.match(logits, boxes, labels, gt_boxes)
            prefix = '' if i == last else f'd{i}.'
            for key, value in self.output_losses(logits, boxes, labels,
                                                 gt_boxes, matches,
                                                 num_boxes).items():
                losses[prefix + key] = value

        enc_labels = labels
        if enc_logits.shape[-1] == 1 and self.num_classes > 1:
            # class-agnostic selection: one class for every box (matched on
            # it too; the released code matches on the real labels, which
            # index past its single logit)
            enc_labels = [torch.zeros_like(x) for x in labels]
        matches = self.match(enc_logits, enc_boxes, enc_labels, gt_boxes)
        for key, value in self.output_losses(enc_logits, enc_boxes,
                                             enc_labels, gt_boxes, matches,
                                             num_boxes).items():
            losses['enc_' + key] = value

        if dn is not None:
            matches = self.denoising_matches(dn.positive_idx, labels,
                                             dn.num_groups)
            for i, (logits, boxes) in enumerate(zip(dn_logits, dn_boxes)):
                prefix = '' if i == last else f'd{i}.'
                for key, value in self.output_losses(
                        logits, boxes, labels, gt_boxes, matches,
                        num_boxes * dn.num_groups).items():
                    losses[f'{prefix}dn_{key}'] = value
        return losses

    @staticmethod
    def denoising_matches(positive_idx: List[Tensor],
                          labels: Sequence[Tensor],
                          num_groups: int) -> Matches:
        """Each positive denoising query with the box it was made from."""
        batch, query, gt = [], [], []
        for i, (idx, lab) in enumerate(zip(positive_idx, labels)):
            batch.append(torch.full_like(idx, i))
            query.append(idx)
            gt.append(
                torch.arange(len(lab), device=idx.device).tile(num_groups))
        return torch.cat(batch), torch.cat(query), torch.cat(gt)
