"""ONNX export of a backbone alone: images -> its tuple of feature maps.

Used for mmpe's ViT backbone (:class:`~mmpe.models.CPVT`: PEG, absolute
tables resampled to the grid, RoPE, iRPE), whose position encodings are
computed per input grid: the exported graph must keep the grid symbolic so
that one file takes any image size. Graph::

    images  (B, C, H, W) float32
    -> feat0, feat1, ...  one (B, D, h_i, w_i) map per backbone output
"""
from typing import Optional, Tuple

from torch import Tensor, nn

from .onnx_export import export_onnx


class BackboneExportWrapper(nn.Module):
    """``forward(images) -> tuple(backbone(images))`` (no padding mask:
    the images are taken whole)."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, images: Tensor) -> Tuple[Tensor, ...]:
        return tuple(self.backbone(images))


def export_backbone_onnx(backbone: nn.Module,
                         out_file: str,
                         images: Tensor,
                         opset_version: Optional[int] = None,
                         optimize: bool = True) -> BackboneExportWrapper:
    """Export ``backbone`` with dynamic batch, height and width.

    Args:
        backbone (nn.Module): In eval mode; ``backbone(images)`` returns a
            tuple (or list) of tensors.
        out_file (str): ``.onnx`` file to write.
        images (Tensor): Example ``(B, C, H, W)`` input, ``B, H, W >= 2``.
        opset_version (int, optional): ONNX opset (None: the exporter's).
        optimize (bool): Optimise the graph (see
            :func:`~mmpe.deployment.export_onnx`).

    Returns:
        BackboneExportWrapper: The exported module; outputs are named
        ``feat0``, ``feat1``, ... in the file.
    """
    from torch.export import Dim
    if min(images.shape[0], *images.shape[-2:]) < 2:
        raise ValueError(
            f'Example images of shape {tuple(images.shape)}: batch, height '
            'and width must be >= 2 (torch.export fixes sizes 0 and 1)')
    wrapper = BackboneExportWrapper(backbone).eval()
    num_outs = len(wrapper(images))
    export_onnx(
        wrapper, (images, ),
        out_file,
        input_names=('images', ),
        output_names=tuple(f'feat{i}' for i in range(num_outs)),
        dynamic_shapes={
            'images': {
                0: Dim('batch', min=1, max=1024),
                2: Dim.DYNAMIC,
                3: Dim.DYNAMIC
            }
        },
        opset_version=opset_version,
        optimize=optimize)
    return wrapper
