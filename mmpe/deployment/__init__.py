"""Deployment: ONNX export of DETR-family detectors (images and their valid
sizes -> last-layer scores and boxes) and of backbones, with PyTorch's
dynamo exporter and dynamic batch / height / width.

Not imported by ``import mmpe``: it needs ``onnx``, ``onnxscript`` and
``onnxruntime`` (``requirements/tests.txt``), imported when a function runs.
"""
from .backbone_onnx import BackboneExportWrapper, export_backbone_onnx
from .detr_onnx import (INPUT_NAMES, OUTPUT_NAMES, SUPPORTED_DETECTORS,
                        SUPPORTED_NAMES, DETRExportWrapper, check_exportable,
                        export_detector_onnx, padding_mask_from_img_shapes)
from .onnx_export import (check_onnx, export_onnx, max_abs_diff,
                          onnxruntime_session, run_onnxruntime)

__all__ = [
    'BackboneExportWrapper', 'DETRExportWrapper', 'INPUT_NAMES',
    'OUTPUT_NAMES', 'SUPPORTED_DETECTORS', 'SUPPORTED_NAMES',
    'check_exportable', 'check_onnx', 'export_backbone_onnx',
    'export_detector_onnx', 'export_onnx', 'max_abs_diff',
    'onnxruntime_session', 'padding_mask_from_img_shapes', 'run_onnxruntime'
]
