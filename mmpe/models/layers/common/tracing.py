"""Whether a forward is being traced into a graph.

Under ``torch.compile``, ``torch.export`` (and with it
``torch.onnx.export(..., dynamo=True)``) and TorchScript tracing, grid sizes
may be symbolic and Python decisions on tensor values would break or freeze
the graph. mmpe's layers ask :func:`is_tracing` at the few places where eager
mode takes a shortcut that a graph cannot (a cache keyed on Python ints, an
``.any()`` that skips an all-false mask, an in-place kernel) and then compute
the same result with plain tensor ops.
"""
import torch


def is_tracing() -> bool:
    """True while TorchDynamo (``torch.compile``, ``torch.export``, the
    dynamo ONNX exporter) or the TorchScript tracer records the forward.

    TorchDynamo evaluates this to a constant at trace time, so it costs no
    graph break.
    """
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def is_exporting() -> bool:
    """True while ``torch.export`` (and with it the dynamo ONNX exporter),
    the TorchScript ONNX exporter or the TorchScript tracer records the
    forward: graphs that must consist of standard ATen ops, unlike a
    ``torch.compile`` graph, which may call mmpe's custom ops."""
    return (torch.compiler.is_exporting() or torch.jit.is_tracing()
            or torch.onnx.is_in_onnx_export())
