"""Removed: ``BackbonePaddingMaskHook``, kept only to say what replaces it.

It parked each batch's valid shapes on the backbone for its next forward,
which broke with model replicas and with a second backbone call in one
forward. The padding mask now goes through the call: a ``PaddingAware*``
detector (:mod:`mmpe.models.detectors.padding_aware`) passes it to the
backbone in every ``extract_feat``.
"""
from mmengine.hooks import Hook

from mmdet.registry import HOOKS

#: mmdet detector type -> its padding-aware replacement in mmpe
REPLACEMENTS = {
    'MaskRCNN': 'PaddingAwareMaskRCNN',
    'RetinaNet': 'PaddingAwareRetinaNet',
    'DETR': 'PaddingAwareDETR',
}


@HOOKS.register_module()
class BackbonePaddingMaskHook(Hook):
    """Raises: the hook was removed (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        choices = ', '.join(f"'{k}' -> '{v}'"
                            for k, v in REPLACEMENTS.items())
        raise ValueError(
            "custom_hooks entry 'BackbonePaddingMaskHook' was removed: drop "
            'it and set model.type to the padding-aware detector instead '
            f'({choices}; any other: class X(PaddingAwareMixin, '
            'YourDetector)), e.g. '
            'configs/quickstart/mask-rcnn_cpvt-tiny_padmask_synthetic.py')
