"""Layer-wise learning-rate decay for plain-ViT backbones (ViTDet's recipe).

References: Bao et al., "BEiT", ICLR 2022 (layer-wise decay for
fine-tuning); Li et al., "Exploring Plain Vision Transformer Backbones for
Object Detection" (ViTDet), ECCV 2022, whose recipe decays by 0.7 per block
for ViT-B. A parameter at depth ``l`` of a backbone with ``n`` blocks gets

.. math::

    \\mathrm{lr} = \\mathrm{lr}_{group} \\cdot r^{\\,n + 1 - l},

``l = 0`` for the input (patch embedding, class token, position table),
``l = i + 1`` for block i, ``l = n + 1`` (factor 1) for everything after the
blocks (final norm, neck, heads). ``lr_group`` is what MMEngine's default
constructor gives the parameter (``custom_keys``' ``lr_mult`` included), so
every other paramwise rule (norm / bias decay, custom keys) applies as usual.
"""
from typing import List, Optional

from mmengine.optim import DefaultOptimWrapperConstructor
from torch import nn

from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class ViTLayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """MMEngine's default constructor, then layer-wise lr decay.

    The backbone (``model.backbone``) must say where its parameters sit:
    ``depth`` (number of blocks) and ``param_layer_id(name)`` in
    ``[0, depth + 1]``, as :class:`~mmpe.models.CPVT` does. Parameters
    outside the backbone keep their lr.

    Config::

        optim_wrapper = dict(
            constructor='ViTLayerDecayOptimWrapperConstructor',
            optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.1),
            paramwise_cfg=dict(layer_decay_rate=0.7, norm_decay_mult=0.))

    Args:
        optim_wrapper_cfg (dict): As :class:`DefaultOptimWrapperConstructor`.
        paramwise_cfg (dict): As :class:`DefaultOptimWrapperConstructor`,
            plus ``layer_decay_rate`` (float in (0, 1], required; 1 is no
            decay).
    """

    def __init__(self,
                 optim_wrapper_cfg: dict,
                 paramwise_cfg: Optional[dict] = None) -> None:
        paramwise_cfg = dict(paramwise_cfg or {})
        rate = paramwise_cfg.pop('layer_decay_rate', None)
        if isinstance(rate, bool) or not isinstance(
                rate, (int, float)) or not 0 < rate <= 1:
            raise ValueError(
                f'Unsupported `paramwise_cfg.layer_decay_rate` {rate!r}, '
                'please choose a number in (0, 1] (ViTDet: 0.7 for ViT-B)')
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        self.layer_decay_rate = float(rate)

    def __call__(self, model: nn.Module):
        if hasattr(model, 'module'):
            model = model.module
        backbone = getattr(model, 'backbone', None)
        if backbone is None or not hasattr(backbone, 'param_layer_id'):
            raise ValueError(
                f'{type(self).__name__}: the model\'s backbone '
                f'{type(backbone).__name__} does not say the depth of its '
                'parameters (`param_layer_id`); supported backbones: CPVT')
        # the default constructor puts every parameter in its own group
        # only when paramwise_cfg is non-empty
        self.paramwise_cfg.setdefault('custom_keys', {})
        return super().__call__(model)

    def add_params(self,
                   params: List[dict],
                   module: nn.Module,
                   prefix: str = '',
                   is_dcn_module=None) -> None:
        """The default groups (one per parameter), each lr scaled by
        ``rate ** (depth + 1 - layer id)`` (module docstring)."""
        start = len(params)
        super().add_params(params, module, prefix, is_dcn_module)
        if prefix:  # the recursion below the model: scaled at the top
            return
        backbone = module.backbone
        num_layers = backbone.depth + 1
        layer_of = {
            id(param): backbone.param_layer_id(name)
            for name, param in backbone.named_parameters()
        }
        for group in params[start:]:
            (param, ) = group['params']
            layer = layer_of.get(id(param), num_layers)
            scale = self.layer_decay_rate**(num_layers - layer)
            group['lr'] = group.get('lr', self.base_lr) * scale
