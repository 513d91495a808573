"""Export a module to ONNX with PyTorch's dynamo exporter, check the file
and run it in onnxruntime.

The exporter is ``torch.onnx.export(..., dynamo=True)``: ``torch.export``
traces the forward into a graph with symbolic sizes (``dynamic_shapes``)
and onnxscript translates it. The file is then validated by
``onnx.checker.check_model``. ``onnx``, ``onnxscript`` and ``onnxruntime``
are imported only here, inside the functions (test dependencies, not
needed to train).
"""
import os
import os.path as osp
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn


def export_onnx(module: nn.Module,
                args: Tuple[Tensor, ...],
                out_file: str,
                input_names: Sequence[str],
                output_names: Sequence[str],
                dynamic_shapes: Dict[str, Dict[int, object]],
                opset_version: Optional[int] = None,
                optimize: bool = True) -> str:
    """Export ``module(*args)`` to ``out_file`` and check the file.

    Args:
        module (nn.Module): In eval mode; its forward takes ``args``
            positionally, named ``input_names`` in the signature.
        args (tuple[Tensor]): Example inputs of the trace. A dynamic size
            must not be 0 or 1 in them (``torch.export`` specialises those).
        out_file (str): The ``.onnx`` file to write (its folder is made).
        input_names / output_names (Sequence[str]): Graph input and output
            names.
        dynamic_shapes (dict): ``{input name: {axis: torch.export.Dim}}``.
        opset_version (int, optional): ONNX opset; None: the exporter's
            default.
        optimize (bool): Run onnxscript's graph optimiser (constant
            folding, dead-node removal) on the exported graph. Same
            outputs; False exports faster (tests).

    Returns:
        str: ``out_file``.
    """
    import onnx  # noqa: F401 (fail early and clearly if missing)
    if module.training:
        raise ValueError('export_onnx: put the module in eval mode first '
                         '(`module.eval()`), dropout and BN would be traced')
    folder = osp.dirname(osp.abspath(out_file))
    os.makedirs(folder, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            module,
            tuple(args),
            out_file,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_shapes=dynamic_shapes,
            opset_version=opset_version,
            dynamo=True,
            external_data=False,
            optimize=optimize,
            verbose=False)
    check_onnx(out_file)
    return out_file


def check_onnx(onnx_file: str) -> None:
    """``onnx.checker.check_model`` on the file (raises if invalid)."""
    import onnx
    onnx.checker.check_model(onnx_file, full_check=True)


def onnxruntime_session(onnx_file: str, num_threads: int = 0):
    """A CPU onnxruntime session of the file (``num_threads`` 0: ORT's
    default)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = num_threads
    options.inter_op_num_threads = max(num_threads, 0)
    return ort.InferenceSession(
        onnx_file, sess_options=options, providers=['CPUExecutionProvider'])


def run_onnxruntime(session, inputs: Dict[str, Tensor]) -> Tuple[Tensor, ...]:
    """Run a session on named torch inputs; outputs as torch tensors."""
    feeds = {
        name: value.detach().cpu().numpy()
        for name, value in inputs.items()
    }
    outputs = session.run(None, feeds)
    return tuple(torch.from_numpy(np.asarray(out)) for out in outputs)


def max_abs_diff(got: Sequence[Tensor], want: Sequence[Tensor]) -> float:
    """Largest ``|got - want|`` over paired tensors of equal shapes."""
    if len(got) != len(want):
        raise ValueError(f'{len(got)} outputs against {len(want)}')
    worst = 0.
    for i, (a, b) in enumerate(zip(got, want)):
        if tuple(a.shape) != tuple(b.shape):
            raise ValueError(f'output {i}: shape {tuple(a.shape)} against '
                             f'{tuple(b.shape)}')
        if a.numel():
            worst = max(worst, (a.double() - b.double()).abs().max().item())
    return worst
