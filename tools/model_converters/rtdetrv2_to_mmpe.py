"""Convert an RT-DETRv2 checkpoint of the authors' code (lyuwenyu/RT-DETR,
``rtdetrv2_pytorch``) to mmpe's RT-DETR weights.

The authors' solver saves ``{'model': state_dict, 'ema': {'module':
state_dict, 'updates': n}, 'optimizer': ..., 'last_epoch': ...}``
(``src/solver/_solver.py`` ``state_dict``; ``src/optim/ema.py``); their
released ``*_ema.pth`` files hold the EMA, which their evaluation uses.
This tool takes the EMA weights when the file has them (``--weights
model`` for the others), maps the keys (``backbone.*``: PResNet ->
PResNetVd (mmdet's ResNetV1d names), ``encoder.*`` -> ``neck.*``:
HybridEncoder -> RTDETRHybridEncoder, ``decoder.*`` -> ``bbox_head.*``;
the maps are :mod:`mmpe.models.utils.rtdetr_encoder_keys` and
:mod:`mmpe.models.utils.rtdetr_decoder_keys`) and writes
``{'state_dict': ..., 'meta': ...}`` for ``load_from``. With ``--backbone``
it converts the authors' ImageNet PResNet files (a bare PResNet state
dict) for a backbone's ``init_cfg``.

Example (RT-DETRv2-L)::

    wget https://github.com/lyuwenyu/storage/releases/download/v0.1/rtdetrv2_r50vd_6x_coco_ema.pth
    python tools/model_converters/rtdetrv2_to_mmpe.py \\
        rtdetrv2_r50vd_6x_coco_ema.pth \\
        checkpoints/rtdetrv2_r50vd_6x_coco_mmpe.pth \\
        --config configs/rtdetr/rtdetrv2_r50vd_6x_coco.py

A file that is not an RT-DETR checkpoint, or (with ``--config``) one whose
keys are not those of the config's model, gets one line naming the keys
and exit status 2; nothing is written.
"""
import argparse
import os
import os.path as osp
import sys
from typing import Dict, List, Optional, Tuple

import torch
from mmengine.config import Config

from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmpe.models.utils.rtdetr_decoder_keys import rtdetr_decoder_key
from mmpe.models.utils.rtdetr_encoder_keys import (convert_presnet,
                                                   hybrid_encoder_key,
                                                   presnet_key)

#: exit status of a bad input file (mmpe's BAD_INPUT_EXIT_CODE)
BAD_INPUT = 2
#: the authors' detector's parts (``RTDETR.backbone / encoder / decoder``)
PARTS = ('backbone.', 'encoder.', 'decoder.')
#: how many keys a message names before "and N more"
SHOWN = 5


class NotConvertible(ValueError):
    """The file is not what the tool converts; the message names why."""


def _names(keys: List[str]) -> str:
    keys = sorted(keys)
    more = f' and {len(keys) - SHOWN} more' if len(keys) > SHOWN else ''
    return ', '.join(keys[:SHOWN]) + more


def authors_state_dict(checkpoint, weights: str = 'auto'
                       ) -> Tuple[Dict[str, torch.Tensor], dict]:
    """The model's state dict in one of the authors' checkpoint layouts.

    Args:
        checkpoint: What ``torch.load`` gave.
        weights (str): ``'auto'`` (the EMA when present, as the authors'
            ``load_tuning_state``), ``'ema'`` or ``'model'``.

    Returns:
        tuple: the state dict and ``meta`` (``weights``, ``updates``).

    Raises:
        NotConvertible: No ``model`` / ``ema.module`` dict of tensors.
    """
    if not isinstance(checkpoint, dict):
        raise NotConvertible(
            f'expected a dict (the authors\' checkpoint), got '
            f'{type(checkpoint).__name__}')
    ema = checkpoint.get('ema')
    has_ema = isinstance(ema, dict) and isinstance(ema.get('module'), dict)
    has_model = isinstance(checkpoint.get('model'), dict)
    if weights == 'ema' or (weights == 'auto' and has_ema):
        if not has_ema:
            raise NotConvertible(
                "no 'ema' entry with a 'module' state dict (keys: "
                f'{_names(list(checkpoint))}); try --weights model')
        return ema['module'], dict(weights='ema', updates=ema.get('updates'))
    if not has_model:
        raise NotConvertible(
            "no 'model' or 'ema' state dict, as the authors' solver saves "
            f'(keys: {_names([str(k) for k in checkpoint])})')
    return checkpoint['model'], dict(weights='model', updates=None)


def _is_presnet(key: str) -> bool:
    try:
        presnet_key(key)
        return True
    except KeyError:
        return False


def _map(key: str) -> Optional[str]:
    """mmpe's key of one of the authors' encoder / decoder keys, None for a
    buffer mmpe derives; KeyError / ValueError for a key of neither."""
    if key.startswith('encoder.'):
        return 'neck.' + hybrid_encoder_key(key[len('encoder.'):])
    if key.startswith('decoder.'):
        return rtdetr_decoder_key(key)
    raise KeyError(key)


def convert_detector(state_dict: Dict[str, torch.Tensor]
                     ) -> Dict[str, torch.Tensor]:
    """The authors' RT-DETR state dict under mmpe's names.

    Raises:
        NotConvertible: Keys of no RT-DETR part, or a part missing.
    """
    backbone, out, foreign = {}, {}, []
    for key, value in state_dict.items():
        if key.startswith('backbone.'):
            if _is_presnet(key[len('backbone.'):]):
                backbone[key[len('backbone.'):]] = value
            else:
                foreign.append(key)
            continue
        try:
            new = _map(key)
        except (KeyError, ValueError):
            foreign.append(key)
            continue
        if new is not None:
            out[new] = value
    missing = [p[:-1] for p in PARTS
               if not any(k.startswith(p) for k in state_dict)]
    if foreign or missing:
        what = []
        if missing:
            what.append(f"no {' / '.join(missing)} keys")
        if foreign:
            what.append(f'{len(foreign)} keys of no RT-DETR part: '
                        f'{_names(foreign)}')
        raise NotConvertible('not an RT-DETR checkpoint of the authors\' '
                             f'code ({"; ".join(what)})')
    # (frozen BNs without num_batches_tracked get the zeros mmdet's BN
    # loads strictly with)
    out.update({'backbone.' + k: v
                for k, v in convert_presnet(backbone).items()})
    return out


def convert_backbone(state_dict: Dict[str, torch.Tensor]
                     ) -> Dict[str, torch.Tensor]:
    """The authors' ImageNet PResNet (a bare ``PResNet`` state dict) under
    PResNetVd's (mmdet's ResNetV1d) names; of a detector's state dict,
    its ``backbone.*`` entries.

    Raises:
        NotConvertible: Keys of no PResNet layer.
    """
    prefix = 'backbone.' if any(
        k.startswith('backbone.') for k in state_dict) else ''
    state = {k[len(prefix):]: v for k, v in state_dict.items()
             if k.startswith(prefix)}
    foreign = [prefix + k for k in state if not _is_presnet(k)]
    if foreign or not state:
        raise NotConvertible(
            "not the authors' PResNet (--backbone): "
            f'{len(foreign)} keys of no PResNet layer: {_names(foreign)}'
            if foreign else 'no keys')
    return convert_presnet(state)


def check_keys(converted: Dict[str, torch.Tensor],
               expected: Dict[str, torch.Tensor]) -> None:
    """Refuse a conversion whose keys or shapes are not the model's.

    Raises:
        NotConvertible: Missing, unexpected or reshaped keys, named.
    """
    missing = [k for k in expected if k not in converted]
    unexpected = [k for k in converted if k not in expected]
    reshaped = [
        f'{k} {tuple(converted[k].shape)} vs {tuple(expected[k].shape)}'
        for k in converted
        if k in expected and converted[k].shape != expected[k].shape
    ]
    what = []
    for name, keys in (('missing', missing), ('unexpected', unexpected),
                       ('of other shapes', reshaped)):
        if keys:
            what.append(f'{len(keys)} {name}: {_names(keys)}')
    if what:
        raise NotConvertible("not the config's model: " + '; '.join(what))


def model_state_dict(config: str, backbone: bool) -> Dict[str, torch.Tensor]:
    """The state dict of the config's model (its backbone with
    ``backbone``), built without pre-trained weights."""
    register_all_modules()
    cfg = Config.fromfile(config)
    model = MODELS.build(cfg.model.backbone if backbone else cfg.model)
    return model.state_dict()


def convert_file(src: str, dst: str, weights: str = 'auto',
                 backbone: bool = False,
                 config: Optional[str] = None) -> dict:
    """Read ``src``, convert, check against ``config``'s model when given,
    write ``dst``; returns the meta written. Nothing is written when a
    check fails (:class:`NotConvertible`)."""
    checkpoint = torch.load(src, map_location='cpu', weights_only=True)
    if backbone:
        state = checkpoint
        if isinstance(state, dict) and isinstance(state.get('model'), dict):
            state = state['model']  # a detector file: its backbone
        if not isinstance(state, dict):
            raise NotConvertible(
                f'expected a dict of weights, got {type(state).__name__}')
        converted = convert_backbone(state)
        meta = dict(weights='backbone', updates=None)
    else:
        state, meta = authors_state_dict(checkpoint, weights)
        converted = convert_detector(state)
    if config is not None:
        check_keys(converted, model_state_dict(config, backbone))
    meta = dict(meta, source=osp.basename(src))
    if osp.dirname(dst):
        os.makedirs(osp.dirname(dst), exist_ok=True)
    torch.save(dict(state_dict=converted, meta=meta), dst)
    return dict(meta, tensors=len(converted))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Convert an RT-DETRv2 checkpoint of the authors' code "
        "(or, with --backbone, their ImageNet PResNet) to mmpe's weights")
    parser.add_argument('src', help="the authors' .pth")
    parser.add_argument('dst', help='output .pth')
    parser.add_argument(
        '--weights', choices=('auto', 'ema', 'model'), default='auto',
        help="which weights of a training checkpoint: the EMA when present "
        "('auto', what the authors evaluate and release), or one of them")
    parser.add_argument(
        '--backbone', action='store_true',
        help="the file is the authors' ImageNet PResNet (ResNet*_vd_*.pth): "
        "write PResNetVd's weights (for a backbone's init_cfg)")
    parser.add_argument(
        '--config', default=None,
        help="an mmpe config: refuse the conversion unless its keys and "
        "shapes are the config's model's (its backbone's with --backbone)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        meta = convert_file(args.src, args.dst, args.weights, args.backbone,
                            args.config)
    except NotConvertible as error:
        print(f'{args.src}: {error}; nothing written', file=sys.stderr)
        sys.exit(BAD_INPUT)
    what = 'backbone' if args.backbone else f"{meta['weights']} weights"
    print(f"Saved {meta['tensors']} tensors ({what}) to {args.dst}")


if __name__ == '__main__':
    main()
