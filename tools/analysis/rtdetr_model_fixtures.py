"""Record the released RT-DETRv2, the whole model (images -> detections),
as test fixtures.

Usage::

    python tools/analysis/rtdetr_model_fixtures.py AUTHORS_CHECKOUT \\
        [--out tests/data/rtdetr_authors/model]

``AUTHORS_CHECKOUT`` is a checkout of lyuwenyu/RT-DETR. The script loads
the released files by file as the two part scripts beside it do
(``rtdetr_encoder_fixtures.py``: ``PResNet``, ``HybridEncoder``;
``rtdetr_decoder_fixtures.py``: ``RTDETRTransformerv2``,
``RTDETRPostProcessor``) plus ``src/zoo/rtdetr/rtdetr.py`` (``RTDETR``:
backbone -> encoder -> decoder), builds the R18vd and R50vd models as the
released configs set them, with each part's weights by its script's rule
(``rtdetr_weight_rule.rule_state`` for the backbone and the encoder,
``rtdetr_decoder_fixtures.rule_tensor`` of ``decoder.<key>`` for the
decoder: the fixtures of both parts stay valid), and records in eval mode,
in float64 (the weights are float32 values; the decoder fixtures say why
float32 is unstable), for each setting of :data:`SETTINGS` one
``<name>.npz``:

* ``image``: the ``(3, 60, 80)`` uint8 image (``rule_image`` resizes it to
  the input size);
* ``{backbone,encoder,decoder}_keys`` / ``_shapes``: the released keys
  (shapes padded with zeros to 4 axes);
* ``logits_first`` / ``logits_max``: the output layer's logits for the
  first ``KEEP_CLASSES`` classes and their maximum over all classes;
  ``boxes``: its boxes (normalised cxcywh), stored as float32;
* ``det_labels`` / ``det_scores`` / ``det_boxes``: ``RTDETRPostProcessor``
  (top 300 over sigmoid scores; boxes in pixels of the input).

Nothing of the authors' code is written: only tensors.
"""
import argparse
import importlib.util
import os
import os.path as osp
import sys

import numpy as np
import torch
from rtdetr_decoder_fixtures import KEEP_CLASSES, keep, load_authors
from rtdetr_decoder_fixtures import rule_tensor as decoder_rule
from rtdetr_encoder_fixtures import SETTINGS as PARTS
from rtdetr_encoder_fixtures import find_src, load_released
from rtdetr_weight_rule import SEED, rule_image, rule_state, small_image

#: the released configs' decoders (R18vd: 3 layers; R50vd: 6) and inputs
#: (640 x 640 with the configs' eval_spatial_size; 480 x 640 without, as
#: the released code runs another size)
DECODERS = {'r18': dict(num_layers=3), 'r50': dict(num_layers=6)}
SETTINGS = {
    'r18_640': ('r18', (640, 640), [640, 640]),
    'r18_480x640': ('r18', (480, 640), None),
    'r50_640': ('r50', (640, 640), [640, 640]),
    'r50_480x640': ('r50', (480, 640), None),
}
NUM_CLASSES = 80


def load_rtdetr(src: str):
    """The released ``RTDETR`` class (backbone -> encoder -> decoder)."""
    spec = importlib.util.spec_from_file_location(
        '_rtdetr_src.zoo.rtdetr.rtdetr',
        osp.join(src, 'zoo', 'rtdetr', 'rtdetr.py'))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.RTDETR


def _keys(state, skip=()):
    keys = [k for k in state if not k.endswith(skip)]
    shapes = np.array([list(state[k].shape) + [0] * (4 - state[k].dim())
                       for k in keys])
    return keys, shapes


def record(classes, name: str, image: torch.Tensor) -> dict:
    presnet_cls, encoder_cls, mods, rtdetr_cls = classes
    part, size, eval_size = SETTINGS[name]
    setting = PARTS[part]
    backbone = presnet_cls(**setting['backbone'], pretrained=False)
    encoder = encoder_cls(**setting['encoder'], eval_spatial_size=eval_size)
    decoder = mods['rtdetrv2_decoder'].RTDETRTransformerv2(
        num_classes=NUM_CLASSES, hidden_dim=256, num_queries=300,
        feat_channels=[256] * 3, feat_strides=[8, 16, 32], num_levels=3,
        num_points=[4, 4, 4], nhead=8, dim_feedforward=1024, dropout=0.0,
        activation='relu', num_denoising=100, label_noise_ratio=0.5,
        box_noise_scale=1.0, eval_idx=-1, cross_attn_method='default',
        query_select_method='default', eval_spatial_size=eval_size,
        **DECODERS[part])
    arrays = dict(image=image.numpy())
    bk, arrays['backbone_shapes'] = _keys(backbone.state_dict())
    ek, arrays['encoder_shapes'] = _keys(encoder.state_dict())
    # derived buffers keep their values (the anchors of eval_spatial_size)
    dk, arrays['decoder_shapes'] = _keys(
        decoder.state_dict(), ('num_points_scale', 'num_batches_tracked',
                               'anchors', 'valid_mask'))
    arrays['backbone_keys'] = np.array(bk)
    arrays['encoder_keys'] = np.array(ek)
    arrays['decoder_keys'] = np.array(['decoder.' + k for k in dk])
    backbone.load_state_dict(
        rule_state([(k, v.shape) for k, v in backbone.state_dict().items()]))
    encoder.load_state_dict(
        rule_state([(k, v.shape) for k, v in encoder.state_dict().items()]))
    decoder.load_state_dict(
        {k: decoder_rule('decoder.' + k, decoder.state_dict()[k].shape)
         for k in dk}, strict=False)
    model = rtdetr_cls(backbone, encoder, decoder).double().eval()
    post = mods['rtdetr_postprocessor'].RTDETRPostProcessor(
        num_classes=NUM_CLASSES, use_focal_loss=True, num_top_queries=300)
    with torch.no_grad():
        out = model(rule_image(image, size).double())
        dets = post(out, torch.tensor([[size[1], size[0]]]))
    for key, value in keep(out['pred_logits']).items():
        arrays[f'logits_{key}'] = value
    arrays['boxes'] = out['pred_boxes'].float().numpy()
    arrays['det_labels'] = dets[0]['labels'].numpy().astype('int64')
    arrays['det_scores'] = dets[0]['scores'].float().numpy()
    arrays['det_boxes'] = dets[0]['boxes'].float().numpy()
    assert KEEP_CLASSES <= NUM_CLASSES
    return arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('checkout', help='a lyuwenyu/RT-DETR checkout')
    parser.add_argument('--out', default='tests/data/rtdetr_authors/model')
    parser.add_argument('--only', nargs='*', choices=sorted(SETTINGS))
    args = parser.parse_args()
    src = find_src(args.checkout)
    presnet_cls, encoder_cls = load_released(src)
    mods = load_authors(args.checkout)
    classes = (presnet_cls, encoder_cls, mods, load_rtdetr(src))
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    image = small_image(SEED)
    for name in args.only or SETTINGS:
        arrays = record(classes, name, image)
        path = osp.join(args.out, f'{name}.npz')
        np.savez_compressed(path, **arrays)
        print(f'{path}: {osp.getsize(path) / 1e6:.2f} MB')


if __name__ == '__main__':
    main()
