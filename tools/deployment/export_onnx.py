"""Export a DETR-family detector (RT-DETR included) to ONNX (PyTorch's
dynamo exporter).

The graph is the detector's tensor forward, images -> class scores and
boxes of the last decoder layer, with dynamic batch, height and width::

    images      (B, 3, H, W)  float32, normalised, padded bottom/right
    img_shapes  (B, 2)        int64, each image's valid (h, w)
    -> scores   (B, Q, C)     class logits;  boxes (B, Q, 4) normalised cxcywh

(see :mod:`mmpe.deployment.detr_onnx`). The file is checked with
``onnx.checker.check_model`` and, unless ``--skip-ort``, onnxruntime is
compared against PyTorch on the export input (a batch of two images, the
second padded to half its width)::

    python tools/deployment/export_onnx.py CONFIG CKPT --out model.onnx \\
        [--shape H W] [--opset N]

Evaluate the file with ``tools/deployment/test_onnx.py CONFIG model.onnx``.
"""
import argparse
import os.path as osp
import sys

import torch
from mmengine.registry import init_default_scope
from mmengine.runner import load_checkpoint

import mmpe  # noqa: F401  (registers modules)
from mmpe.deployment import (check_exportable, export_detector_onnx,
                             max_abs_diff, onnxruntime_session,
                             run_onnxruntime)
from mmpe.engine import safe_checkpoint_loading
from mmpe.utils.tool_args import (add_cfg_options, add_unsafe_checkpoint,
                                  load_config)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Export a DETR-family detector to ONNX (dynamic batch, '
        'height and width)')
    parser.add_argument('config', help='config file')
    parser.add_argument(
        'checkpoint',
        help='checkpoint file (`none`: random weights, for trying it out)')
    parser.add_argument('--out', required=True, help='the .onnx file')
    parser.add_argument(
        '--shape',
        type=int,
        nargs=2,
        metavar=('H', 'W'),
        default=None,
        help='padded height and width of the example batch of the trace '
        '(default: the test pipeline\'s Resize scale, else 128 128); the '
        'exported graph takes any size')
    parser.add_argument(
        '--opset', type=int, default=None, help='ONNX opset version '
        '(default: the exporter\'s)')
    parser.add_argument(
        '--skip-ort',
        action='store_true',
        help='do not compare onnxruntime against PyTorch')
    add_unsafe_checkpoint(parser)
    add_cfg_options(parser)
    return parser.parse_args(argv)


def default_shape(cfg):
    """(H, W) of the test pipeline's fixed Resize scale (mmdet's scale is
    (w, h)), rounded up to the preprocessor's pad_size_divisor; else 128."""
    shape = (128, 128)
    pipeline = cfg.get('test_dataloader', {}).get('dataset', {}).get(
        'pipeline', [])
    for step in pipeline:
        if step.get('type') == 'Resize' and step.get('scale'):
            scale = step['scale']
            scale = (scale, scale) if isinstance(scale, int) else scale
            shape = (min(scale), max(scale)) if step.get(
                'keep_ratio') else (scale[1], scale[0])
    divisor = cfg.model.get('data_preprocessor', {}).get(
        'pad_size_divisor', 1)
    return tuple(-(-s // divisor) * divisor for s in shape)


def build_detector(cfg, checkpoint, allow_unsafe=False):
    from mmdet.registry import MODELS
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(cfg.model)
    if checkpoint == 'none':
        model.init_weights()
    else:
        with safe_checkpoint_loading(allow_unsafe):
            load_checkpoint(model, checkpoint, map_location='cpu')
    return model.eval()


def example_inputs(shape, generator=None):
    """A batch of two normalised images of ``shape``; the second is valid
    only on its left half-width (the rest padding, zero as mmdet pads)."""
    height, width = shape
    images = torch.randn(2, 3, height, width, generator=generator)
    img_shapes = torch.tensor([[height, width], [height, max(width // 2, 1)]])
    images[1, :, :, img_shapes[1, 1]:] = 0
    return images, img_shapes


def main(argv=None):
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options)
    if args.checkpoint != 'none' and not osp.isfile(args.checkpoint):
        print(f'error: checkpoint {args.checkpoint!r} does not exist',
              file=sys.stderr)
        return 2
    model = build_detector(cfg, args.checkpoint,
                           args.allow_unsafe_checkpoint)
    try:
        check_exportable(model)
    except ValueError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    shape = tuple(args.shape) if args.shape else default_shape(cfg)
    images, img_shapes = example_inputs(
        shape, torch.Generator().manual_seed(0))
    wrapper = export_detector_onnx(
        model, args.out, images, img_shapes, opset_version=args.opset)
    print(f'exported {type(model).__name__} to {args.out} (checked by '
          f'onnx.checker); example batch {tuple(images.shape)}')
    if not args.skip_ort:
        with torch.no_grad():
            want = wrapper(images, img_shapes)
        got = run_onnxruntime(
            onnxruntime_session(args.out),
            dict(images=images, img_shapes=img_shapes))
        print(f'onnxruntime vs PyTorch max abs difference: scores '
              f'{max_abs_diff(got[:1], want[:1]):.3g}, boxes '
              f'{max_abs_diff(got[1:], want[1:]):.3g}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
