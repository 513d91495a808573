"""LookHere: each head restricted to a direction of view, plus a distance
penalty per head.

Fuller et al., "LookHere: Vision Transformers with Directed Attention
Generalize and Extrapolate" (NeurIPS 2024, Sec. 3); the bias follows the
released ``create_lh_bias_tensor`` / ``create_lh_layer_tensor``
(GreenCUBIC/lookhere ``lookhere.py``). With ``(Dy, Dx) = (jy - iy, jx - ix)``
the key's offset from the query (rows grow downwards) and ``D`` the
Euclidean distance (``distance='linear'``; ``'sqrt'``: ``D^{1/2}``,
``'square'``: ``D^2``), head ``n`` of layer ``l`` adds

.. math::

    B^n_l(Dy, Dx) = \\begin{cases}
        -g \\, s_l \\, m_n \\, D & (Dy, Dx) \\text{ in the head's view} \\\\
        -M & \\text{otherwise}
    \\end{cases}

with ``g`` the global slope, ``s_l`` the layer's entry of
``linspace(layer_slopes[0], layer_slopes[1], num_layers)``, ``m_n`` the
head's slope and ``M = 2^{14}`` (see below). A head's view is the
intersection of its directions' half-planes / cones, each including its
border: ``'up'`` ``Dy <= 0``, ``'down'`` ``Dy >= 0``, ``'left'``
``Dx <= 0``, ``'right'`` ``Dx >= 0``; the triangles ``'tri_up'``
``|Dx| <= -Dy``, ``'tri_down'`` ``|Dx| <= Dy``, ``'tri_left'``
``|Dy| <= -Dx``, ``'tri_right'`` ``|Dy| <= Dx``; ``'diag_a_b'`` the union
of triangles ``a`` and ``b``; ``'zero'`` removes the distance penalty
(``D = 0``). Every pair sees itself, so no row is all masked.

``directions`` names the authors' per-head layouts (four heads each, e.g.
``'halves'`` (LookHere-180), ``'corners'`` (LookHere-90), ``'eighths1'``;
parts joined by ``-`` give groups of heads, as the released code assigns
them for 6, 12 and 16 heads), and the slopes are the released ones:
``2^{-1}, 2^{-2}, ...`` per group of four heads for the directed layouts,
``1/4, 1/16, 1/64, 1/256`` for ``'none'`` / ``'zero'`` ones. The released
code's ``'center'`` layout (a bias of the key's distance from the grid's
centre, an absolute position) is not a relative bias and is refused; its
``fill_with`` is ``'inf'`` here (its default). The released code rounds
the map to bfloat16; here it is computed in the attention's dtype.

The masked value: the released code fills masked pairs with the largest
bfloat16 (``nan_to_num(posinf=finfo(bfloat16).max)``), here ``-2^{14}``
(exact in every float dtype). Wherever a query's row has an unmasked key
the probabilities are the same, the masked ones exactly 0 (``exp``
underflows to 0 in float32 and float64 for gaps beyond ~745). The rows
differ only where every unmasked key is padding (a padded query looking
only at padding; the released code has no padding): with ``-3.4e38`` such
a row overflows in kernels that scale logits by ``log2 e`` (NaN) and its
log-sum-exp absorbs the logits, with ``-2^{14}`` it is a finite softmax
over the masked keys. No loss reads those padded rows.
Class tokens see, and are seen by, every token with bias 0 (the released
code's zero row and column).
"""
import itertools
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from mmdet.registry import MODELS
from torch import Tensor

from ....utils.arg_checks import check_int
from ..common.arg_checks import check_choice
from .offset_term import OffsetBias, grid_offsets

_TRIANGLES = ('tri_up', 'tri_down', 'tri_left', 'tri_right')
#: The released code's per-head direction layouts (four heads each)
DIRECTIONS: Dict[str, List[Tuple[str, ...]]] = {
    'none': [()] * 4,
    'zero': [('zero', )] * 4,
    'none1zero3': [()] + [('zero', )] * 3,
    'none2zero2': [()] * 2 + [('zero', )] * 2,
    'none3zero1': [()] * 3 + [('zero', )],
    'halves': [('up', ), ('down', ), ('left', ), ('right', )],
    'corners': [('up', 'left'), ('up', 'right'), ('down', 'left'),
                ('down', 'right')],
    'triangles': [(t, ) for t in _TRIANGLES],
    'diagonals': [('diag_up_right', ), ('diag_up_left', ),
                  ('diag_down_right', ), ('diag_down_left', )],
    'eighths1': [('tri_up', 'left'), ('tri_down', 'left'),
                 ('tri_left', 'up'), ('tri_right', 'up')],
    'eighths2': [('tri_up', 'right'), ('tri_down', 'right'),
                 ('tri_left', 'down'), ('tri_right', 'down')],
    'zerohalves': [('zero', d) for d in ('up', 'down', 'left', 'right')],
    'zerocorners': [('zero', 'up', 'left'), ('zero', 'up', 'right'),
                    ('zero', 'down', 'left'), ('zero', 'down', 'right')],
    'zerotriangles': [('zero', t) for t in _TRIANGLES],
}
#: (heads, parts) -> heads of each part, as the released code assigns them
#: (one part: any multiple of four heads)
PART_HEADS = {(6, 2): (4, 2), (12, 2): (8, 4), (16, 2): (8, 8),
              (12, 3): (4, 4, 4), (16, 3): (8, 4, 4), (16, 4): (4, 4, 4, 4)}
DISTANCES = ('linear', 'sqrt', 'square')
#: The fill of masked pairs (before the sign; module docstring)
MASKED = 2.0**14


def _visible(direction: str, dy: Tensor, dx: Tensor) -> Tensor:
    """Whether the key offset ``(Dy, Dx)`` is in the view of a direction
    (module docstring)."""
    if direction.startswith('diag_'):
        _, first, second = direction.split('_')
        return (_visible('tri_' + first, dy, dx)
                | _visible('tri_' + second, dy, dx))
    return {
        'up': lambda: dy <= 0,
        'down': lambda: dy >= 0,
        'left': lambda: dx <= 0,
        'right': lambda: dx >= 0,
        'tri_up': lambda: dx.abs() <= -dy,
        'tri_down': lambda: dx.abs() <= dy,
        'tri_left': lambda: dy.abs() <= -dx,
        'tri_right': lambda: dy.abs() <= dx,
    }[direction]()


def _group_slopes(name: str, count: int) -> List[float]:
    """The released code's slopes of ``count`` consecutive heads of one
    layout: ``get_none_slopes`` for layouts without a direction, else
    ``get_slopes``."""
    if 'zero' in name or 'none' in name:
        base = [0.25, 0.0625, 0.015625, 0.00390625]
        if count in (2, 4):
            return base[:count]
        return [s for s in base for _ in range(count // 4)]
    # numpy's arange(1, count / 4 + 1): ceil(count / 4) slopes, 4 heads each
    return [2.0**-(k + 1) for k in range(-(-count // 4)) for _ in range(4)]


def head_layout(directions: str,
                num_heads: int) -> Tuple[List[Tuple[str, ...]], List[float]]:
    """Each head's directions and slope for a ``directions`` name."""
    if not isinstance(directions, str):
        raise ValueError(f'Unsupported LookHere `directions` {directions!r}, '
                         f'please give a name of {tuple(DIRECTIONS)} or '
                         "several joined by '-'")
    parts = directions.split('-')
    for part in parts:
        if part == 'center':
            raise ValueError(
                "Unsupported LookHere `directions` part 'center': it biases "
                "by the key's distance from the grid's centre, an absolute "
                'position, not an offset; please choose from '
                f'{tuple(DIRECTIONS)}')
        check_choice('directions', part, tuple(DIRECTIONS))
    if len(parts) == 1 and num_heads % 4 == 0:
        counts = (num_heads, )
    else:
        counts = PART_HEADS.get((num_heads, len(parts)))
    if counts is None:
        raise ValueError(
            f'Unsupported LookHere `directions` {directions!r} with '
            f'num_heads={num_heads}: one layout takes a multiple of 4 heads, '
            f'several take (heads, parts) in {sorted(PART_HEADS)}')
    heads, names = [], []
    for part, count in zip(parts, counts):
        heads += (DIRECTIONS[part] * ((count + 3) // 4))[:count]
        names += [part] * count
    slopes = [s for name, group in itertools.groupby(names)
              for s in _group_slopes(name, len(list(group)))]
    if len(slopes) != num_heads:  # e.g. 'none' over 6 heads
        raise ValueError(
            f'Unsupported LookHere `directions` {directions!r} with '
            f'num_heads={num_heads}: the released slopes give {len(slopes)} '
            'values; choose another number of heads or layout')
    return heads, slopes


@MODELS.register_module()
class LookHere(OffsetBias):
    """LookHere's directed masks and distance penalty of one attention (no
    parameters; module docstring).

    Args:
        num_heads (int): Heads of the attention.
        directions (str): The heads' layout. Defaults to 'corners'
            (LookHere-90).
        distance (str): ``'linear'``, ``'sqrt'`` or ``'square'``.
            Defaults to 'linear'.
        global_slope (float): ``g``. Defaults to 1.
        layer_slopes (tuple[float, float]): First and last layer's slope
            ``s_l`` (linear in between). Defaults to (1, 1).
        layer (int): This attention's layer ``l``. Defaults to 0.
        num_layers (int): Layers of the stack. Defaults to 1.
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self,
                 num_heads: int,
                 directions: str = 'corners',
                 distance: str = 'linear',
                 global_slope: float = 1.0,
                 layer_slopes: Sequence[float] = (1.0, 1.0),
                 layer: int = 0,
                 num_layers: int = 1,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(num_heads, init_cfg=init_cfg)
        check_choice('distance', distance, DISTANCES)
        check_int('num_layers', num_layers)
        check_int('layer', layer, minimum=0)
        if layer >= num_layers:
            raise ValueError(f'Unsupported `layer` {layer!r}, please choose '
                             f'an int in [0, {num_layers - 1}] (num_layers)')
        slopes = [global_slope] + list(layer_slopes) if isinstance(
            layer_slopes, (list, tuple)) and len(layer_slopes) == 2 else []
        if not slopes or not all(
                isinstance(s, (int, float)) and not isinstance(s, bool)
                and s > 0 for s in slopes):
            raise ValueError(
                f'Unsupported LookHere slopes global_slope={global_slope!r}, '
                f'layer_slopes={layer_slopes!r}: please choose a number > 0 '
                'and a pair of them')
        self.directions, self.distance = directions, distance
        self.head_directions, head_slopes = head_layout(directions, num_heads)
        start, end = layer_slopes
        # numpy's linspace(start, end, num_layers)[layer]
        step = (end - start) / (num_layers - 1) if num_layers > 1 else 0.
        self.layer_slope = (end if num_layers > 1 and layer == num_layers - 1
                            else start + layer * step)
        self.global_slope = float(global_slope)
        # Python floats: exact in any dtype the table is made in
        self.slopes = [self.global_slope * self.layer_slope * s
                       for s in head_slopes]

    def table(self, height: int, width: int, device: torch.device,
              dtype: torch.dtype) -> Tensor:
        work = torch.promote_types(dtype, torch.float32)
        qy, qx = grid_offsets(height, width, device, work)
        dy, dx = -qy, -qx  # the key's offset from the query
        dist = torch.sqrt(dy * dy + dx * dx)
        dist = {'linear': dist, 'sqrt': dist.sqrt(),
                'square': dist * dist}[self.distance]
        rows = []
        for n, dirs in enumerate(self.head_directions):
            base = torch.zeros_like(dist) if 'zero' in dirs else dist
            row = -self.slopes[n] * base
            for direction in dirs:
                if direction != 'zero':
                    row = row.masked_fill(~_visible(direction, dy, dx),
                                          -MASKED)
            rows.append(row.reshape(-1))
        return torch.stack(rows).to(dtype)

    def extra_repr(self) -> str:
        return (f'num_heads={self.num_heads}, directions={self.directions!r},'
                f' distance={self.distance!r}, slope={self.global_slope} x '
                f'{self.layer_slope}')
