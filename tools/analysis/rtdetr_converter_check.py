"""Check the converter end to end against the RT-DETR authors' code.

Builds the authors' RT-DETRv2 (R18vd or R50vd, loaded by file as
``rtdetr_checkpoint_layout.py`` does) with their initialisation, random
BatchNorm statistics and an EMA that differs from the model, saves a
checkpoint as their solver does (``{'date', 'last_epoch', 'model', 'ema':
{'module', 'updates'}}``), converts it with
``tools/model_converters/rtdetrv2_to_mmpe.py --config``, loads the result
strictly into the config's model and compares, in evaluation at 640 x 640
on one random image, the backbone's and the encoder's levels, the
decoder's logits and boxes given the same encoder levels, and the whole
model's; the authors' plain (non-EMA) weights as the control that must
differ. Prints the largest differences; writes nothing. With random weights
the encoder's cell scores nearly tie, so float32 rounding of the levels
(~1e-7) can change which cells the whole model selects: the decoder is
compared on the authors' encoder levels for that reason.

Usage::

    git clone https://github.com/lyuwenyu/RT-DETR /tmp/RT-DETR
    python tools/analysis/rtdetr_converter_check.py /tmp/RT-DETR r18 \\
        configs/rtdetr/rtdetrv2_r18vd_120e_coco.py
    python tools/analysis/rtdetr_converter_check.py /tmp/RT-DETR r50 \\
        configs/rtdetr/rtdetrv2_r50vd_6x_coco.py
"""
import argparse
import copy
import importlib.util
import os.path as osp
import tempfile

import torch
from mmengine.config import Config

from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from rtdetr_checkpoint_layout import SETTINGS, build, load_released

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONVERTER = osp.join(ROOT, 'tools', 'model_converters', 'rtdetrv2_to_mmpe.py')


def authors_models(checkout: str, name: str):
    """The authors' model (random BN statistics) and an EMA of it whose
    weights differ."""
    modules = load_released(osp.join(checkout, 'rtdetrv2_pytorch', 'src'))
    torch.manual_seed(0)
    model = build(modules, SETTINGS[name])
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if key.endswith('running_var'):
                value.copy_(torch.rand(value.shape, generator=gen) + 0.5)
            elif key.endswith('running_mean'):
                value.copy_(torch.randn(value.shape, generator=gen) * 0.1)
    ema = copy.deepcopy(model)
    with torch.no_grad():
        for param in ema.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.01)
    return model.eval(), ema.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('checkout', help='a clone of lyuwenyu/RT-DETR')
    parser.add_argument('model', choices=list(SETTINGS))
    parser.add_argument('config', help="the mmpe config of that model")
    args = parser.parse_args()
    register_all_modules()
    spec = importlib.util.spec_from_file_location('rtdetrv2_to_mmpe',
                                                  CONVERTER)
    converter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(converter)
    model, ema = authors_models(args.checkout, args.model)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = osp.join(tmp, 'authors.pth'), osp.join(tmp, 'mmpe.pth')
        torch.save(dict(date='', last_epoch=0, model=model.state_dict(),
                        ema=dict(module=ema.state_dict(), updates=1)), src)
        converter.main([src, dst, '--config', args.config])
        state = torch.load(dst, weights_only=True)['state_dict']
    cfg = Config.fromfile(args.config)
    cfg.model.backbone.init_cfg = None
    ours = MODELS.build(cfg.model)
    print(ours.load_state_dict(state, strict=True))
    ours.eval()
    image = torch.rand(1, 3, 640, 640,
                       generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs_levels = ema.backbone(image)
        for a, b in zip(theirs_levels, ours.backbone(image)):
            print(f'backbone {tuple(a.shape)}: max |diff| '
                  f'{(a - b).abs().max():.2e} of {a.abs().max():.2f}')
        theirs_enc = ema.encoder(theirs_levels)
        for a, b in zip(theirs_enc, ours.neck(ours.backbone(image))):
            print(f'encoder {tuple(a.shape)}: max |diff| '
                  f'{(a - b).abs().max():.2e} of {a.abs().max():.2f}')
        theirs = ema.decoder(list(theirs_enc))
        head_inputs = ours.forward_transformer(tuple(theirs_enc), None,
                                               image.shape[-2:])
        logits, boxes = ours.bbox_head.forward(**head_inputs)
        print('decoder on their encoder levels: logits max |diff| '
              f"{(theirs['pred_logits'] - logits[-1]).abs().max():.2e}, "
              f"boxes {(theirs['pred_boxes'] - boxes[-1]).abs().max():.2e}")
        theirs = ema(image)
        logits, boxes = ours._forward(image)
        print('whole model: logits max |diff| '
              f"{(theirs['pred_logits'] - logits[-1]).abs().max():.2e}, "
              f"boxes {(theirs['pred_boxes'] - boxes[-1]).abs().max():.2e}")
        control = model(image)['pred_logits']
        print('control (their non-EMA weights): logits max |diff| '
              f'{(control - logits[-1]).abs().max():.2e}')


if __name__ == '__main__':
    main()
