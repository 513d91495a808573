"""The offset biases by name: an attention's ``bias_cfg``.

``bias_cfg = dict(type=..., **arguments)`` with ``type`` one of
:data:`GRID_BIASES` (``'log-cpb'``: :class:`.log_cpb.LogCPB`,
``'alibi-2d'``: :class:`.alibi_2d.ALiBi2D`, ``'lookhere'``:
:class:`.lookhere.LookHere`) and the arguments of :data:`GRID_BIAS_ARGS`;
the attention sets ``num_heads``, a stack of layers LookHere's ``layer`` /
``num_layers`` (:func:`layer_bias_cfg`).
"""
from typing import Dict, Optional, Tuple

from .alibi_2d import ALiBi2D
from .log_cpb import LogCPB
from .lookhere import LookHere
from .offset_term import OffsetBias

#: ``bias_cfg['type']`` -> the module
GRID_BIASES = {'log-cpb': LogCPB, 'alibi-2d': ALiBi2D, 'lookhere': LookHere}
#: The arguments a config gives each type
GRID_BIAS_ARGS: Dict[str, Tuple[str, ...]] = {
    'log-cpb': ('pretrained_size', 'hidden'),
    'alibi-2d': (),
    'lookhere': ('directions', 'distance', 'global_slope', 'layer_slopes'),
}
#: Set per layer by the stack that builds the attentions
_STACK_ARGS = {'lookhere': ('layer', 'num_layers')}


def check_bias_cfg(cfg, field: str = 'bias_cfg',
                   stack_args: bool = False) -> Dict:
    """``cfg`` as a dict with a known ``type`` and only its arguments
    (``stack_args``: also those a stack sets per layer); a ``ValueError``
    naming ``field``, the value and the choices otherwise."""
    if not isinstance(cfg, dict) or cfg.get('type') not in GRID_BIASES:
        raise ValueError(
            f'Unsupported `{field}` {cfg!r}, please give a dict with `type` '
            f'from {tuple(GRID_BIASES)} and its arguments')
    kind = cfg['type']
    allowed = GRID_BIAS_ARGS[kind] + (_STACK_ARGS.get(kind, ())
                                      if stack_args else ())
    unknown = sorted(set(cfg) - {'type', *allowed})
    if unknown:
        raise ValueError(
            f'Unsupported `{field}` arguments {unknown} for type {kind!r}, '
            f'please choose from {allowed}')
    if kind == 'log-cpb' and 'pretrained_size' not in cfg:
        raise ValueError(
            f"`{field}` of type 'log-cpb' needs `pretrained_size`, the "
            'pre-training grid (h0, w0) that normalises the offsets '
            "(Swin-V2's pretrained_window_size)")
    return dict(cfg)


def build_grid_bias(cfg: Optional[Dict],
                    num_heads: int) -> Optional[OffsetBias]:
    """The module of a checked ``bias_cfg`` (None: None)."""
    if cfg is None:
        return None
    cfg = check_bias_cfg(cfg, stack_args=True)
    kind = cfg.pop('type')
    return GRID_BIASES[kind](num_heads=num_heads, **cfg)


def layer_bias_cfg(cfg: Optional[Dict], layer: int,
                   num_layers: int) -> Optional[Dict]:
    """Layer ``layer``'s ``bias_cfg`` in a stack of ``num_layers``:
    LookHere's per-layer slope needs both; the others are the same in every
    layer."""
    if cfg is None or cfg.get('type') not in _STACK_ARGS:
        return cfg
    return dict(cfg, layer=layer, num_layers=num_layers)
