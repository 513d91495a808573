"""Learning-rate factors by module path (detectron2's ``lr_factor_func``).

detectron2's ``get_default_optimizer_params`` (the parameter groups of every
detrex config) gives each parameter the optimiser's lr and weight decay,
weight decay ``weight_decay_norm`` for the parameters of norm layers, and
then multiplies the lr by ``lr_factor_func(name)`` of the parameter's full
name; detrex's DINO configs (DINO-ViTDet included) use
``lambda name: 0.1 if "backbone" in name else 1``. MMEngine's default
constructor cannot say that: a ``custom_keys`` entry that sets ``lr_mult``
also replaces the norm rule for the parameters it matches (a backbone norm
would decay). This constructor keeps MMEngine's groups as they are and then
scales each lr:

.. math::

    \\mathrm{lr} = \\mathrm{lr}_{group} \\cdot f_k,

``k`` the longest key of ``lr_factors`` that is the parameter's module path
or a module above it, ``f_k`` its factor (1 where no key matches).
"""
from numbers import Real
from typing import Dict, List, Optional

from mmengine.optim import DefaultOptimWrapperConstructor
from torch import nn

from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS


def _matches(name: str, key: str) -> bool:
    """Whether ``key`` is the parameter path ``name`` or a module above it
    (``'neck'`` matches ``neck.fpn_convs.0.conv.weight``, not
    ``necklace.weight``)."""
    return name == key or name.startswith(key + '.')


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LrFactorOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """MMEngine's default constructor, then an lr factor per module path.

    Config (detrex's DINO-ViTDet: the backbone and the simple pyramid at
    lr x 0.1, DINO's channel mapper and transformer at the full lr, weight
    decay 0 on norms)::

        optim_wrapper = dict(
            constructor='LrFactorOptimWrapperConstructor',
            optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4),
            paramwise_cfg=dict(
                norm_decay_mult=0.,
                lr_factors={'backbone': 0.1, 'neck': 0.1,
                            'neck.out_convs': 1.0}))

    Args:
        optim_wrapper_cfg (dict): As :class:`DefaultOptimWrapperConstructor`.
        paramwise_cfg (dict): As :class:`DefaultOptimWrapperConstructor`
            (its lr multipliers apply first), plus ``lr_factors`` (required):
            a dict of module paths (``'backbone'``, ``'neck.out_convs'``)
            to positive factors; the longest matching path gives a
            parameter's factor. A path that names no parameter of the model
            is refused when the optimiser is built.
    """

    def __init__(self,
                 optim_wrapper_cfg: dict,
                 paramwise_cfg: Optional[dict] = None) -> None:
        paramwise_cfg = dict(paramwise_cfg or {})
        factors = paramwise_cfg.pop('lr_factors', None)
        if not isinstance(factors, dict) or not factors:
            raise ValueError(
                f'Unsupported `paramwise_cfg.lr_factors` {factors!r}, please '
                "give a dict of module paths to factors, e.g. "
                "{'backbone': 0.1}")
        for key, value in factors.items():
            if not isinstance(key, str) or not key or key.startswith('.') \
                    or key.endswith('.'):
                raise ValueError(
                    f'Unsupported `paramwise_cfg.lr_factors` key {key!r}, '
                    "please give a module path such as 'backbone' or "
                    "'neck.out_convs'")
            if isinstance(value, bool) or not isinstance(
                    value, Real) or not value > 0:
                raise ValueError(
                    f'Unsupported `paramwise_cfg.lr_factors[{key!r}]` '
                    f'{value!r}, please choose a positive number')
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        # longest first: the most specific path decides
        self.lr_factors: Dict[str, float] = {
            k: float(factors[k])
            for k in sorted(factors, key=len, reverse=True)
        }

    def __call__(self, model: nn.Module):
        # the default constructor makes one group per parameter only when
        # paramwise_cfg is non-empty
        self.paramwise_cfg.setdefault('custom_keys', {})
        return super().__call__(model)

    def factor(self, name: str) -> float:
        """The lr factor of the parameter path ``name``."""
        for key, value in self.lr_factors.items():
            if _matches(name, key):
                return value
        return 1.0

    def add_params(self,
                   params: List[dict],
                   module: nn.Module,
                   prefix: str = '',
                   is_dcn_module=None) -> None:
        """The default groups (one per parameter), each lr then multiplied
        by its module path's factor (module docstring)."""
        start = len(params)
        super().add_params(params, module, prefix, is_dcn_module)
        if prefix:  # the recursion below the model: scaled at the top
            return
        names = dict(module.named_parameters())
        unused = [k for k in self.lr_factors
                  if not any(_matches(n, k) for n in names)]
        if unused:
            children = [name for name, _ in module.named_children()]
            raise ValueError(
                f'{type(self).__name__}: `paramwise_cfg.lr_factors` '
                f'{unused} name no parameter of {type(module).__name__} '
                f'(its modules: {children})')
        name_of = {id(p): n for n, p in names.items()}
        for group in params[start:]:
            (param, ) = group['params']
            scale = self.factor(name_of[id(param)])
            group['lr'] = group.get('lr', self.base_lr) * scale
