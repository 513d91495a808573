"""Evaluate an exported DETR-family detector in onnxruntime, as
``tools/test.py`` evaluates the checkpoint.

The config's test dataloader feeds batches through the detector's
``data_preprocessor`` (normalisation, bottom/right padding); onnxruntime
runs the graph of ``tools/deployment/export_onnx.py`` on the padded images
and their valid sizes; the head's own post-processing (mmdet's
``bbox_head.predict_by_feat``, ``RTDETRHead.predict`` for RT-DETR; the
output layer as a one-layer stack, ``rescale=True``) turns the scores and
boxes into detections in original image coordinates, and the config's test
evaluator (COCO AP) scores them::

    python tools/deployment/test_onnx.py CONFIG model.onnx [--batch-size N] \
        [--out preds.pkl] [--out-json metrics.json]

Only the config is read for the model: its head's post-processing
(``test_cfg``) and data preprocessor; the weights are those in the file.
"""
import argparse
import json
import os.path as osp
import sys

import numpy as np
import torch
from mmengine.evaluator import Evaluator
from mmengine.registry import init_default_scope
from mmengine.runner import Runner

import mmpe  # noqa: F401  (registers modules)
from mmpe.deployment import (INPUT_NAMES, OUTPUT_NAMES, check_exportable,
                             onnxruntime_session, predict_from_outputs)
from mmpe.utils import (DataNotFoundError, check_data_paths,
                        fix_worker_settings)
from mmpe.utils.tool_args import (add_cfg_options, dump_detections,
                                  load_config)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Evaluate an exported ONNX detector with onnxruntime')
    parser.add_argument('config', help='the config the model was exported '
                        'from')
    parser.add_argument('onnx_file', help='the .onnx file')
    parser.add_argument(
        '--batch-size',
        type=int,
        default=None,
        help='test batch size (default: the config\'s)')
    parser.add_argument(
        '--threads',
        type=int,
        default=0,
        help='onnxruntime intra-op threads (0: its default)')
    parser.add_argument(
        '--out',
        help='dump predictions to a pickle file (as tools/test.py --out)')
    parser.add_argument(
        '--out-json', help='also write the metrics to this json file')
    add_cfg_options(parser)
    return parser.parse_args(argv)


def check_graph_io(session, onnx_file):
    inputs = tuple(i.name for i in session.get_inputs())
    outputs = tuple(o.name for o in session.get_outputs())
    if inputs != INPUT_NAMES or outputs != OUTPUT_NAMES:
        raise ValueError(
            f'{onnx_file}: inputs {inputs} and outputs {outputs}, expected '
            f'{INPUT_NAMES} -> {OUTPUT_NAMES} (a file of '
            'tools/deployment/export_onnx.py)')


def evaluate(cfg, onnx_file, threads=0):
    """COCO metrics of ``onnx_file`` on ``cfg.test_dataloader``.

    Returns:
        dict: The evaluator's metrics (``coco/bbox_mAP`` ...).
    """
    from mmdet.registry import MODELS
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(cfg.model).eval()  # post-processing only
    check_exportable(model)
    session = onnxruntime_session(onnx_file, threads)
    check_graph_io(session, onnx_file)
    dataloader = Runner.build_dataloader(cfg.test_dataloader)
    evaluator = Evaluator(cfg.test_evaluator)
    evaluator.dataset_meta = dataloader.dataset.metainfo
    for data_batch in dataloader:
        with torch.no_grad():
            data = model.data_preprocessor(data_batch, False)
        inputs, samples = data['inputs'], data['data_samples']
        img_shapes = np.array([s.img_shape[:2] for s in samples],
                              dtype=np.int64)
        scores, boxes = session.run(
            None, dict(images=inputs.numpy(), img_shapes=img_shapes))
        results = predict_from_outputs(
            model, torch.from_numpy(scores), torch.from_numpy(boxes),
            [s.metainfo for s in samples], rescale=True)
        samples = model.add_pred_to_datasample(samples, results)
        evaluator.process(data_samples=samples, data_batch=data_batch)
    return evaluator.evaluate(len(dataloader.dataset))


def main(argv=None):
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options)
    if not osp.isfile(args.onnx_file):
        print(f'error: ONNX file {args.onnx_file!r} does not exist',
              file=sys.stderr)
        return 2
    if args.batch_size is not None:
        if args.batch_size < 1:
            print(f'error: --batch-size must be >= 1, got {args.batch_size}',
                  file=sys.stderr)
            return 2
        cfg.test_dataloader.batch_size = args.batch_size
    try:
        check_data_paths(cfg, ('test', ))
    except DataNotFoundError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    if args.out is not None:
        try:
            dump_detections(cfg, args.out)
        except ValueError as err:
            print(f'error: {err}', file=sys.stderr)
            return 2
    fix_worker_settings(cfg)
    metrics = evaluate(cfg, args.onnx_file, args.threads)
    print(' '.join(f'{k}: {v}' for k, v in metrics.items()))
    if args.out_json:
        with open(args.out_json, 'w') as f:
            json.dump(metrics, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
