"""Deployment: ONNX export of DETR-family detectors, RT-DETR included
(images and their valid sizes -> last-layer scores and boxes) and of
backbones, with PyTorch's
dynamo exporter and dynamic batch / height / width.

Not imported by ``import mmpe``: it needs ``onnx``, ``onnxscript`` and
``onnxruntime`` (``requirements/tests.txt``), imported when a function runs.
"""
from .backbone_onnx import BackboneExportWrapper, export_backbone_onnx
from .detr_onnx import (INPUT_NAMES, OUTPUT_NAMES, SUPPORTED_DETECTORS,
                        SUPPORTED_NAMES, DETRExportWrapper, check_exportable,
                        export_detector_onnx, export_wrapper,
                        predict_from_outputs)
from .img_shapes import (padding_mask_from_img_shapes,
                         valid_ratios_from_img_shapes)
from .onnx_export import (check_onnx, export_onnx, max_abs_diff,
                          onnxruntime_session, run_onnxruntime)
from .rtdetr_onnx import RTDETRExportWrapper

__all__ = [
    'BackboneExportWrapper', 'DETRExportWrapper', 'INPUT_NAMES',
    'OUTPUT_NAMES', 'RTDETRExportWrapper', 'SUPPORTED_DETECTORS',
    'SUPPORTED_NAMES', 'check_exportable', 'check_onnx',
    'export_backbone_onnx', 'export_detector_onnx', 'export_onnx',
    'export_wrapper', 'max_abs_diff', 'onnxruntime_session',
    'padding_mask_from_img_shapes', 'predict_from_outputs',
    'run_onnxruntime',
    'valid_ratios_from_img_shapes'
]
