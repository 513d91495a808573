"""Record the released RT-DETRv2 decoder side's outputs as test fixtures.

Usage::

    python tools/analysis/rtdetr_decoder_fixtures.py AUTHORS_CHECKOUT \\
        [--out tests/data/rtdetr_authors/decoder]

``AUTHORS_CHECKOUT`` is a checkout of lyuwenyu/RT-DETR (the folder that
holds ``rtdetrv2_pytorch``, or that folder itself). The script loads the
released ``src/zoo/rtdetr/{utils,box_ops,denoising,rtdetrv2_decoder,
matcher,rtdetrv2_criterion,rtdetr_postprocessor}.py`` by file (their
package's ``__init__`` files import the whole zoo, and torchvision, which
does not load beside the CPU torch: :func:`torchvision_stand_in` gives the
two torchvision functions the files call), builds their
``RTDETRTransformerv2`` for each setting of :data:`SETTINGS` with the
weights of :func:`rule_tensor` (a function of each key's name and shape,
so the tests rebuild them), feeds it the encoder features of
:func:`rule_features` and records, per setting, one ``<name>.npz``:

* ``keys`` / ``shapes``: the released model's decoder keys and shapes;
* everything runs in float64 (the weights are float32 values): a random
  network amplifies rounding by ~4x per layer, and the nearest-cell
  sampling jumps, so float32 results differ between CPUs by more than any
  useful tolerance; outputs are stored as float32;
* ``eval_*``: inference on the first image: the selected queries' logits
  and boxes
  (``enc_*``), the ``eval_idx`` layer's, the post-processed detections;
* ``train_*`` (if the setting trains): with ``torch.manual_seed(SEED)``
  before the forward, the denoising groups, every layer's outputs
  (denoising queries first), the matching of the last layer and every
  loss term (the released names).

Logits are stored for the first :data:`KEEP_CLASSES` classes and as their
maximum over all classes (files stay small); boxes whole. Nothing of the
authors' code is written: only tensors.
"""
import argparse
import importlib
import os
import os.path as osp
import sys
import types
import zlib
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

#: the settings: layers and eval_idx as the released configs (R18vd 3
#: layers; R50vd 6 layers, eval_idx -1; R50vd-m 6 layers, eval_idx 2)
SETTINGS = {
    'r18_default_640': dict(num_layers=3, eval_idx=-1, method='default',
                            select='default', input=(640, 640), train=True),
    'r18_default_480x640': dict(num_layers=3, eval_idx=-1, method='default',
                                select='default', input=(480, 640),
                                train=False),
    'r18_discrete_640': dict(num_layers=3, eval_idx=-1, method='discrete',
                             select='default', input=(640, 640),
                             train=False),
    'r18_agnostic_640': dict(num_layers=3, eval_idx=-1, method='default',
                             select='agnostic', input=(640, 640),
                             train=False),
    'r50_default_640': dict(num_layers=6, eval_idx=-1, method='default',
                            select='default', input=(640, 640), train=True),
    'r50_default_480x640': dict(num_layers=6, eval_idx=-1, method='default',
                                select='default', input=(480, 640),
                                train=False),
    'r50m_discrete_640': dict(num_layers=6, eval_idx=2, method='discrete',
                              select='default', input=(640, 640),
                              train=False),
}
NUM_CLASSES = 80
HIDDEN = 256
STRIDES = (8, 16, 32)
BATCH = 2
SEED = 0
KEEP_CLASSES = 16
#: ground truth: per image (labels, boxes (cx, cy, w, h) normalised)
GT_COUNTS = (3, 5)


def rule_tensor(name: str, shape: Sequence[int]) -> torch.Tensor:
    """The weight of one key: a function of its name and shape only.

    Normal draws from a generator seeded by the name's CRC-32, scaled as a
    trained network's: weights by ``1 / sqrt(fan_in)``, biases 0.1, norm
    scales ``1 + 0.1 N``, BN running variances ``1 + 0.1 |N|``.
    """
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    x = torch.randn(tuple(shape), generator=gen)
    leaf = name.rsplit('.', 1)[-1]
    if leaf == 'running_var':
        return 1 + 0.1 * x.abs()
    if leaf in ('running_mean', 'bias') or leaf.endswith('_bias'):
        return 0.1 * x
    if len(shape) == 1:  # norm scales
        return 1 + 0.1 * x
    if 'embed' in name:
        return x
    fan_in = int(np.prod(shape[1:]))
    return x / fan_in**0.5


def rule_features(input_shape: Tuple[int, int],
                  batch: int = BATCH) -> List[torch.Tensor]:
    """The encoder's maps ``(B, 256, H / s, W / s)`` for ``s`` in 8, 16,
    32: standard normal draws, one generator per level."""
    feats = []
    for level, s in enumerate(STRIDES):
        gen = torch.Generator().manual_seed(1000 + level)
        h, w = input_shape[0] // s, input_shape[1] // s
        feats.append(torch.randn(batch, HIDDEN, h, w, generator=gen))
    return feats


def rule_targets() -> List[Dict[str, torch.Tensor]]:
    """Each image's labels and normalised ``(cx, cy, w, h)`` boxes.

    Coordinates are multiples of 1/64, so that corners in pixels (mmdet's
    ground truth) and back are exact in float32 at the settings' sizes: the
    denoising boxes then start from the same bits in both codes.
    """
    gen = torch.Generator().manual_seed(7)
    targets = []
    for n in GT_COUNTS:
        labels = torch.randint(0, NUM_CLASSES, (n, ), generator=gen)
        centre = 0.2 + 0.6 * torch.rand(n, 2, generator=gen)
        size = 0.05 + 0.3 * torch.rand(n, 2, generator=gen)
        boxes = torch.round(torch.cat([centre, size], 1) * 64) / 64
        targets.append(dict(labels=labels, boxes=boxes))
    return targets


def torchvision_stand_in() -> Dict[str, types.ModuleType]:
    """``torchvision`` with what the released files call: ``ops.boxes.
    box_area`` and ``ops.box_convert`` (cxcywh -> xyxy), written from
    their documented formulas; any other name is missing."""

    def box_area(boxes):
        return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])

    def box_convert(boxes, in_fmt, out_fmt):
        if (in_fmt, out_fmt) != ('cxcywh', 'xyxy'):
            raise NotImplementedError(f'stand-in: {in_fmt} -> {out_fmt}')
        cx, cy, w, h = boxes.unbind(-1)
        return torch.stack(
            [cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], -1)

    tv = types.ModuleType('torchvision')
    ops = types.ModuleType('torchvision.ops')
    boxes = types.ModuleType('torchvision.ops.boxes')
    boxes.box_area = box_area
    ops.boxes, ops.box_convert, tv.ops = boxes, box_convert, ops
    return {'torchvision': tv, 'torchvision.ops': ops,
            'torchvision.ops.boxes': boxes}


def load_authors(checkout: str) -> Dict[str, types.ModuleType]:
    """The released modules by file, under the package ``_rtdetr_src``."""
    root = checkout
    if osp.isdir(osp.join(root, 'rtdetrv2_pytorch')):
        root = osp.join(root, 'rtdetrv2_pytorch')
    src = osp.join(root, 'src')
    if not osp.isfile(osp.join(src, 'zoo', 'rtdetr', 'rtdetrv2_decoder.py')):
        raise SystemExit(f'{checkout}: no rtdetrv2_pytorch/src/zoo/rtdetr/'
                         'rtdetrv2_decoder.py (pass a lyuwenyu/RT-DETR '
                         'checkout)')
    if 'torchvision' not in sys.modules:
        try:
            import torchvision  # noqa: F401
        except Exception:  # no torchvision, or one that does not load
            sys.modules.update(torchvision_stand_in())

    def package(name, path=None):
        mod = types.ModuleType(name)
        mod.__path__ = [path] if path else []
        sys.modules[name] = mod
        return mod

    package('_rtdetr_src', src)
    core = package('_rtdetr_src.core')
    core.register = lambda *a, **k: (lambda cls: cls)
    package('_rtdetr_src.misc')
    dist = types.ModuleType('_rtdetr_src.misc.dist_utils')
    dist.get_world_size = lambda: 1
    dist.is_dist_available_and_initialized = lambda: False
    sys.modules[dist.__name__] = dist
    package('_rtdetr_src.zoo', osp.join(src, 'zoo'))
    package('_rtdetr_src.zoo.rtdetr', osp.join(src, 'zoo', 'rtdetr'))
    names = ('denoising', 'rtdetrv2_decoder', 'matcher', 'rtdetrv2_criterion',
             'rtdetr_postprocessor')
    return {n: importlib.import_module(f'_rtdetr_src.zoo.rtdetr.{n}')
            for n in names}


def keep(logits: torch.Tensor) -> Dict[str, np.ndarray]:
    """A logits tensor as its first classes and its max over classes."""
    logits = logits.float()
    return dict(first=logits[..., :KEEP_CLASSES].numpy(),
                max=logits.amax(-1).numpy())


def record(mods, setting: dict) -> Dict[str, np.ndarray]:
    """One setting's arrays (see the module doc)."""
    torch.manual_seed(SEED)
    model = mods['rtdetrv2_decoder'].RTDETRTransformerv2(
        num_classes=NUM_CLASSES, hidden_dim=HIDDEN, num_queries=300,
        feat_channels=[HIDDEN] * 3, feat_strides=list(STRIDES), num_levels=3,
        num_points=[4, 4, 4], nhead=8, num_layers=setting['num_layers'],
        dim_feedforward=1024, dropout=0.0, activation='relu',
        num_denoising=100, label_noise_ratio=0.5, box_noise_scale=1.0,
        eval_idx=setting['eval_idx'],
        cross_attn_method=setting['method'],
        query_select_method=setting['select'])
    state = model.state_dict()
    keys = [k for k in state if not k.endswith(
        ('num_points_scale', 'num_batches_tracked'))]
    weights = {k: rule_tensor('decoder.' + k, state[k].shape) for k in keys}
    model.load_state_dict(weights, strict=False)
    model.double()
    feats = [f.double() for f in rule_features(setting['input'])]
    arrays = dict(keys=np.array(['decoder.' + k for k in keys]),
                  shapes=np.array([list(state[k].shape) + [0] * (4 - len(
                      state[k].shape)) for k in keys]),
                  feat_sums=np.array([f.sum().item() for f in feats]))
    targets = rule_targets()
    arrays['gt_labels'] = torch.cat([t['labels'] for t in targets]).numpy()
    arrays['gt_boxes'] = torch.cat([t['boxes'] for t in targets]).numpy()

    # inference (the first image): the selected queries, the eval layer,
    # the detections
    model.eval()
    with torch.no_grad():
        memory, shapes = model._get_encoder_input([f[:1] for f in feats])
        anchors, valid = model._generate_anchors(shapes)
        out_memory = model.enc_output(valid.to(memory.dtype) * memory)
        _, enc_logits, enc_coords = model._select_topk(
            out_memory, model.enc_score_head(out_memory),
            model.enc_bbox_head(out_memory) + anchors, model.num_queries)
        out = model([f[:1] for f in feats])
        post = mods['rtdetr_postprocessor'].RTDETRPostProcessor(
            num_classes=NUM_CLASSES, use_focal_loss=True,
            num_top_queries=300)
        h, w = setting['input']
        dets = post(out, torch.tensor([[w, h]]))
    for name, value in keep(enc_logits).items():
        arrays[f'eval_enc_logits_{name}'] = value
    arrays['eval_enc_boxes'] = enc_coords.sigmoid().float().numpy()
    for name, value in keep(out['pred_logits']).items():
        arrays[f'eval_logits_{name}'] = value
    arrays['eval_boxes'] = out['pred_boxes'].float().numpy()
    for key in ('labels', 'boxes', 'scores'):
        arrays[f'eval_det_{key}'] = torch.stack([d[key] for d in dets
                                                 ]).numpy().astype(
                                                     'float32' if key !=
                                                     'labels' else 'int64')
    if not setting['train']:
        return arrays

    # training: denoising groups, every layer, matching, losses (the
    # released matcher takes boxes of the outputs' type)
    targets = [dict(labels=t['labels'], boxes=t['boxes'].double())
               for t in targets]
    model.train()
    torch.manual_seed(SEED)
    dn = mods['denoising'].get_contrastive_denoising_training_group(
        targets, NUM_CLASSES, 300, model.denoising_class_embed, 100, 0.5,
        1.0)
    arrays['train_dn_boxes_unact'] = dn[1].detach().numpy()
    arrays['train_dn_attn_mask'] = dn[2].numpy()
    arrays['train_dn_positive_idx'] = torch.cat(
        dn[3]['dn_positive_idx']).numpy()
    torch.manual_seed(SEED)
    out = model(feats, targets)
    layers = out['aux_outputs'] + [out]
    logits = torch.stack([o['pred_logits'] for o in layers]).detach()
    boxes = torch.stack([o['pred_boxes'] for o in layers]).detach()
    dn_logits = torch.stack([o['pred_logits']
                             for o in out['dn_aux_outputs']]).detach()
    dn_boxes = torch.stack([o['pred_boxes']
                            for o in out['dn_aux_outputs']]).detach()
    for name, value in keep(torch.cat([dn_logits, logits], 2)).items():
        arrays[f'train_logits_{name}'] = value
    arrays['train_boxes'] = torch.cat([dn_boxes, boxes], 2).float().numpy()
    enc = out['enc_aux_outputs'][0]
    for name, value in keep(enc['pred_logits'].detach()).items():
        arrays[f'train_enc_logits_{name}'] = value
    arrays['train_enc_boxes'] = enc['pred_boxes'].detach().float().numpy()

    matcher = mods['matcher'].HungarianMatcher(
        dict(cost_class=2, cost_bbox=5, cost_giou=2), use_focal_loss=True,
        alpha=0.25, gamma=2.0)
    criterion = mods['rtdetrv2_criterion'].RTDETRCriterionv2(
        matcher, dict(loss_vfl=1, loss_bbox=5, loss_giou=2),
        ['vfl', 'boxes'], alpha=0.75, gamma=2.0, num_classes=NUM_CLASSES)
    indices = matcher({k: out[k] for k in ('pred_logits', 'pred_boxes')},
                      targets)['indices']
    arrays['train_match_query'] = torch.cat([i for i, _ in indices]).numpy()
    arrays['train_match_gt'] = torch.cat([j for _, j in indices]).numpy()
    losses = criterion(out, targets)
    arrays['loss_names'] = np.array(sorted(losses))
    arrays['loss_values'] = np.array(
        [losses[k].item() for k in sorted(losses)], dtype=np.float64)
    return arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('checkout', help='a lyuwenyu/RT-DETR checkout')
    parser.add_argument('--out', default='tests/data/rtdetr_authors/decoder')
    parser.add_argument('--only', nargs='*', choices=sorted(SETTINGS))
    args = parser.parse_args()
    mods = load_authors(args.checkout)
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    for name in args.only or SETTINGS:
        arrays = record(mods, SETTINGS[name])
        path = osp.join(args.out, f'{name}.npz')
        np.savez_compressed(path, **arrays)
        print(f'{path}: {osp.getsize(path) / 1e6:.2f} MB')


if __name__ == '__main__':
    main()
