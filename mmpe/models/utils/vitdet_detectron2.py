"""detectron2 ViTDet weights onto :class:`~mmpe.models.backbones.CPVT` and
:class:`~mmpe.models.necks.ViTSimpleFPN` keys.

detectron2's ViTDet (``projects/ViTDet``; ``modeling/backbone/vit.py``:
``ViT`` inside ``SimpleFeaturePyramid``) saves its backbone as::

    backbone.net.patch_embed.proj.{weight,bias}   (C, 3, p, p), (C,)
    backbone.net.pos_embed                        (1, [1 +] g * g, C)
    backbone.net.blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}.*
    backbone.net.blocks.N.attn.rel_pos_{h,w}      (2 S - 1, C / heads) in a
        window block, (2 * 64 - 1, C / heads) in a global one (1024 / 16)
    backbone.simfp_<s>.<i>.*                      the pyramid level of
        stride 2 ** s: deconvolutions / LayerNorm / max-pool, then a 1x1 and
        a 3x3 conv (each ``.weight`` and, with norm="LN", ``.norm.*``)

and its detection heads as ``proposal_generator.*`` / ``roi_heads.*``.
:func:`vitdet_d2_to_mmpe` maps the backbone and the pyramid onto an mmdet
detector's ``backbone.*`` (CPVT) and ``neck.*`` (ViTSimpleFPN) keys::

    backbone.net.patch_embed.proj.*   -> backbone.patch_embed.*
    backbone.net.pos_embed            -> backbone.pos_embed (class row
                                         dropped: get_abs_pos drops it)
    backbone.net.blocks.N.<layer>.*   -> backbone.blocks.N.<layer>.*
    backbone.net.blocks.N.attn.rel_pos_h / _w
                            -> backbone.blocks.N.attn.rel_pos.table_h / _w
    backbone.simfp_<s>.*              -> neck.stages.k.* (the deconvs, the
                                         LayerNorm), neck.lateral_convs.k.*
                                         (1x1), neck.fpn_convs.k.* (3x3)

The heads are not converted: detectron2's RPN and ROI heads (Mask R-CNN,
Cascade) are other modules than mmdet's, with other layouts and box
encodings. :func:`infer_vitdet_config` reads the architecture from the
shapes and gives the CPVT / ViTSimpleFPN arguments that compute what
detectron2 computes (``window_padding='zeros'``,
``pos_embed_interp='detectron2'``, no final norm).
"""
import math
import re
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

#: Key prefixes of detectron2's detection heads (not converted).
D2_HEAD_PREFIXES = ('proposal_generator.', 'roi_heads.')
_BLOCK = re.compile(r'^backbone\.net\.blocks\.(\d+)\.(.+)$')
_BLOCK_LAYERS = re.compile(
    r'^(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(weight|bias)$')
_SIMFP = re.compile(r'^backbone\.simfp_(\d+)\.(\d+)\.(.+)$')
#: ViTDet's global blocks by depth (ViT-B, -L, -H; detectron2's configs)
VITDET_GLOBAL_BLOCKS = {12: (2, 5, 8, 11), 24: (5, 11, 17, 23),
                        32: (7, 15, 23, 31)}


def _not_vitdet(keys: Sequence[str]) -> ValueError:
    """The error for a checkpoint of another architecture."""
    if any(k.startswith('backbone.bottom_up.') for k in keys):
        kind = ("a detectron2 detector with a multi-scale backbone "
                "(backbone.bottom_up.*: Swin, MViTv2 or ResNet under an FPN)")
    elif any(k.startswith('blocks.') or k in ('cls_token', 'pos_embed')
             for k in keys):
        kind = ('a plain timm / DeiT / MAE ViT; convert it with '
                'tools/model_converters/timm_vit_to_cpvt.py')
    else:
        kind = 'an unknown layout'
    return ValueError(
        'vitdet_d2_to_mmpe: not a detectron2 ViTDet checkpoint (no '
        f'backbone.net.* keys of ViT + SimpleFeaturePyramid): {kind}; first '
        f'keys: {sorted(keys)[:5]}')


def _grid_of(rows: int, name: str) -> int:
    if rows % 2 == 0:
        raise ValueError(f'vitdet_d2_to_mmpe: {name} has {rows} rows; a '
                         'relative-position table has 2 n - 1')
    return (rows + 1) // 2


def infer_vitdet_config(state_dict: Dict[str, Tensor],
                        num_heads: Optional[int] = None,
                        window_size: Optional[int] = None,
                        global_blocks: Optional[Sequence[int]] = None
                        ) -> Dict[str, dict]:
    """CPVT and ViTSimpleFPN arguments of a detectron2 ViTDet state dict.

    Sizes come from the shapes: ``embed_dims`` and ``patch_size`` from the
    patch embedding, ``depth`` from the blocks, ``mlp_ratio`` from
    ``mlp.fc1``, ``num_heads`` from the width of the relative tables
    (``C / heads``), the absolute table's grid from ``pos_embed``; the
    window blocks are those whose tables have fewer rows than the largest
    (``2 S - 1`` against ``2 * 64 - 1``), the global blocks' grid
    (``rel_pos_cfg.input_size``) is the largest table's.

    The window layout is read from the tables only where they tell it:
    where every block's tables have one size (a window as large as the
    global grid reads as no window) it must be given (``window_size=0``
    for global attention everywhere, or ``global_blocks``, the window size
    then being the other blocks' grid, or both); without relative tables
    ``num_heads``, ``window_size`` and ``global_blocks`` (unless
    ``window_size=0``) must be given. Otherwise a ``ValueError`` says what
    is missing.

    Args:
        state_dict (dict[str, Tensor]): detectron2's ``model`` weights.
        num_heads (int, optional): Attention heads; read from the relative
            tables when they exist (a different value is refused).
        window_size (int, optional): ``S`` of the window blocks (0: no
            windows). Defaults to None: read from the tables.
        global_blocks (sequence[int], optional): Blocks of global
            attention. Defaults to None: read from the tables.

    Returns:
        dict: ``backbone`` (CPVT arguments, ``type`` included) and ``neck``
        (ViTSimpleFPN arguments); ``neck`` is None without ``simfp_`` keys.
    """
    keys = list(state_dict)
    if 'backbone.net.patch_embed.proj.weight' not in state_dict:
        raise _not_vitdet(keys)
    patch_w = state_dict['backbone.net.patch_embed.proj.weight']
    dims, in_chans, ph, pw = patch_w.shape
    if ph != pw:
        raise ValueError(f'vitdet_d2_to_mmpe: a {ph} x {pw} patch; CPVT '
                         'takes square patches')
    blocks = sorted({int(m[1]) for m in map(_BLOCK.match, keys) if m})
    if not blocks or blocks != list(range(len(blocks))):
        raise ValueError(f'vitdet_d2_to_mmpe: blocks {blocks} are not '
                         '0 .. depth - 1')
    depth = len(blocks)
    fc1 = state_dict['backbone.net.blocks.0.mlp.fc1.weight']
    rel = [(state_dict.get(f'backbone.net.blocks.{i}.attn.rel_pos_h'),
            state_dict.get(f'backbone.net.blocks.{i}.attn.rel_pos_w'))
           for i in blocks]
    has_rel = rel[0][0] is not None
    if has_rel:
        head_dim = rel[0][0].shape[1]
        if dims % head_dim:
            raise ValueError(f'vitdet_d2_to_mmpe: tables of width '
                             f'{head_dim} do not divide {dims} channels')
        if num_heads not in (None, dims // head_dim):
            raise ValueError(f'vitdet_d2_to_mmpe: num_heads={num_heads}, '
                             f'but the tables are {head_dim} wide: '
                             f'{dims // head_dim} heads')
        num_heads = dims // head_dim
        if any(h is None or w is None for h, w in rel):
            raise ValueError('vitdet_d2_to_mmpe: some blocks lack '
                             'attn.rel_pos_h / rel_pos_w')
        rows = [(h.shape[0], w.shape[0]) for h, w in rel]
        big = max(rows)
        window_size, global_blocks = _layout_from_tables(
            rows, window_size, global_blocks)
        input_size = (_grid_of(big[0], 'rel_pos_h'),
                      _grid_of(big[1], 'rel_pos_w'))
    elif num_heads is None:
        raise ValueError('vitdet_d2_to_mmpe: no relative tables to read the '
                         'heads from; give num_heads')
    elif window_size is None or (window_size and global_blocks is None):
        raise ValueError(
            'vitdet_d2_to_mmpe: no relative tables to read the window layout '
            f'from (window_size={window_size}, global_blocks='
            f'{global_blocks}); give window_size (0: global attention in '
            'every block) and global_blocks (ViTDet: window_size=14, '
            f'global_blocks={VITDET_GLOBAL_BLOCKS.get(depth, "?")} for '
            f'depth {depth})')
    if global_blocks is None:  # window_size 0: every block global
        global_blocks = tuple(blocks)
    encodings: List[str] = []
    backbone = dict(
        type='CPVT',
        arch=dict(embed_dims=dims, depth=depth, num_heads=num_heads,
                  mlp_ratio=fc1.shape[0] / dims),
        patch_size=ph, in_channels=in_chans, out_indices=(-1, ),
        use_cls_token=False, final_norm=False,
        qkv_bias='backbone.net.blocks.0.attn.qkv.bias' in state_dict,
        window_size=window_size, global_blocks=tuple(global_blocks),
        window_padding='zeros')
    table = state_dict.get('backbone.net.pos_embed')
    if table is not None:
        side = _table_side(table)
        encodings.append('learnable')
        backbone.update(img_size=side * ph, pos_embed_interp='detectron2')
    if has_rel:
        encodings.append('rel-pos')
        backbone['rel_pos_cfg'] = dict(input_size=input_size)
    backbone['pos_encoding'] = tuple(encodings) or 'none'
    return dict(backbone=backbone, neck=_neck_config(state_dict, dims, ph))


def _layout_from_tables(rows: List[Tuple[int, int]],
                        window_size: Optional[int],
                        global_blocks: Optional[Sequence[int]]
                        ) -> Tuple[int, Tuple[int, ...]]:
    """``window_size`` and ``global_blocks`` from the blocks' table rows
    ``(2 h - 1, 2 w - 1)`` where not given: global blocks have the largest
    tables, window blocks the others (of one size, ``2 S - 1``).

    Where all tables have one size the layout is ambiguous (no windows, or
    windows of the global grid's size): refused unless ``window_size=0``
    or ``global_blocks`` is given.
    """
    big = max(rows)
    if global_blocks is None and len(set(rows)) == 1 and window_size != 0:
        grid = _grid_of(big[0], 'rel_pos_h')
        raise ValueError(
            f'vitdet_d2_to_mmpe: every block has tables of {big[0]} rows '
            f'({grid} x {grid}), so the weights do not tell global blocks '
            f'from windows of {grid} (window_size={window_size}); give '
            'window_size=0 (--window-size 0: global attention in every '
            'block) or global_blocks (--global-blocks, the others then '
            f'windows of {grid})')
    if global_blocks is None:
        global_blocks = tuple(i for i, r in enumerate(rows) if r == big)
    if window_size is None:
        small = {r for i, r in enumerate(rows) if i not in global_blocks}
        if len(small) > 1 or any(a != b for a, b in small):
            raise ValueError(f'vitdet_d2_to_mmpe: window blocks with '
                             f'tables of several sizes {sorted(small)}')
        window_size = _grid_of(small.pop()[0], 'rel_pos_h') if small else 0
    return window_size, tuple(global_blocks)


def _table_side(table: Tensor) -> int:
    """The side g of ``pos_embed`` (1, [1 +] g * g, C)."""
    n = table.shape[1]
    for rows in (n, n - 1):
        if math.isqrt(rows)**2 == rows:
            return math.isqrt(rows)
    raise ValueError(f'vitdet_d2_to_mmpe: pos_embed of {n} rows is neither '
                     'a square grid nor a class row and a square grid')


def _simfp_stages(state_dict: Dict[str, Tensor]) -> List[int]:
    return sorted({int(m[1]) for m in map(_SIMFP.match, state_dict) if m})


def _neck_config(state_dict: Dict[str, Tensor], dims: int,
                 patch: int) -> Optional[dict]:
    """ViTSimpleFPN arguments of the ``simfp_<s>`` levels (stride 2 ** s),
    None without them."""
    stages = _simfp_stages(state_dict)
    if not stages:
        return None
    scales = tuple(patch / 2**s for s in stages)
    first = f'backbone.simfp_{stages[0]}.'
    lateral = _LAYERS[scales[0]][0]
    out_channels = state_dict[f'{first}{lateral}.weight'].shape[0]
    norm = f'{first}{lateral}.norm.weight' in state_dict
    return dict(
        type='ViTSimpleFPN', in_channels=dims, out_channels=out_channels,
        scale_factors=scales,
        # + LastLevelMaxPool (ViTDet's top block; it has no weights)
        num_outs=len(scales) + 1, extra_type='maxpool',
        norm_cfg=dict(type='LayerNorm2d', eps=1e-6) if norm else None)


#: scale -> (index of the 1x1 conv in simfp_<s>, {index: mmpe stage key})
_LAYERS = {
    4.0: (4, {0: '0', 1: '1.norm', 3: '3'}),
    2.0: (1, {0: ''}),
    1.0: (0, {}),
    0.5: (1, {}),
}


def _map_simfp(key: str, stages: List[int], patch: int) -> Optional[str]:
    """mmpe's neck key of a ``backbone.simfp_<s>.<i>.<rest>`` key."""
    m = _SIMFP.match(key)
    stage, index, rest = int(m[1]), int(m[2]), m[3]
    scale = patch / 2**stage
    if scale not in _LAYERS:
        return None
    k = stages.index(stage)
    lateral, stage_layers = _LAYERS[scale]
    if index in (lateral, lateral + 1):
        conv = 'lateral_convs' if index == lateral else 'fpn_convs'
        if rest in ('weight', 'bias'):
            return f'neck.{conv}.{k}.conv.{rest}'
        if rest in ('norm.weight', 'norm.bias'):
            return f'neck.{conv}.{k}.ln.norm.{rest[5:]}'
        return None
    if index in stage_layers and rest in ('weight', 'bias'):
        layer = stage_layers[index]
        return f'neck.stages.{k}.' + (f'{layer}.{rest}' if layer else rest)
    return None


def _map_backbone(key: str, value: Tensor) -> Tuple[Optional[str], Tensor]:
    """mmpe's backbone key (and value) of a ``backbone.net.*`` key."""
    if key.startswith('backbone.net.patch_embed.proj.'):
        return 'backbone.patch_embed.' + key.rsplit('.', 1)[1], value
    if key == 'backbone.net.pos_embed':
        side = _table_side(value)
        return 'backbone.pos_embed', value[:, value.shape[1] - side * side:]
    m = _BLOCK.match(key)
    if m is None:
        return None, value
    if _BLOCK_LAYERS.match(m[2]):
        return f'backbone.blocks.{m[1]}.{m[2]}', value
    if m[2] in ('attn.rel_pos_h', 'attn.rel_pos_w'):
        return (f'backbone.blocks.{m[1]}.attn.rel_pos.table_{m[2][-1]}',
                value)
    return None, value


def vitdet_d2_to_mmpe(
        state_dict: Dict[str, Tensor],
        config: Optional[Dict[str, dict]] = None
) -> Tuple['OrderedDict[str, Tensor]', Dict[str, dict], Dict[str, list]]:
    """Map a detectron2 ViTDet state dict onto mmpe's detector keys.

    Args:
        state_dict (dict[str, Tensor]): detectron2's ``model`` weights.
        config (dict, optional): :func:`infer_vitdet_config`'s result (or
            an edited one). Defaults to None: inferred.

    Returns:
        tuple: the converted weights (``backbone.*``, ``neck.*``), the
        config they were checked against and a report: ``dropped`` (the
        detection heads' keys, not converted).

    Raises:
        ValueError: For a checkpoint of another architecture, keys with no
            mmpe counterpart (listed), or shapes that differ from those of
            the model the config builds (listed).
    """
    keys = list(state_dict)
    if not any(k.startswith('backbone.net.') for k in keys):
        raise _not_vitdet(keys)
    config = infer_vitdet_config(state_dict) if config is None else config
    patch = config['backbone']['patch_size']
    stages = _simfp_stages(state_dict)
    out: 'OrderedDict[str, Tensor]' = OrderedDict()
    unknown, dropped = [], []
    for key, value in state_dict.items():
        if key.startswith(D2_HEAD_PREFIXES):
            dropped.append(key)
            continue
        new = None
        if key.startswith('backbone.net.'):
            new, value = _map_backbone(key, value)
        elif _SIMFP.match(key):
            new = _map_simfp(key, stages, patch)
        if new is None:
            unknown.append(key)
        else:
            out[new] = value
    if unknown:
        raise ValueError(
            f'vitdet_d2_to_mmpe: {len(unknown)} keys with no CPVT / '
            f'ViTSimpleFPN counterpart (residual blocks and other ViTDet '
            f'variants are not supported): {unknown[:20]}')
    check_shapes(out, config)
    return out, config, dict(dropped=dropped)


def check_shapes(converted: Dict[str, Tensor],
                 config: Dict[str, dict]) -> None:
    """Raise unless ``converted`` has exactly the keys and shapes of the
    CPVT (and ViTSimpleFPN) that ``config`` builds (built on the meta
    device: no memory, no initialisation cost)."""
    from mmdet.registry import MODELS
    from mmengine.registry import DefaultScope

    want = {}
    # the modules by name from mmdet's registry (as a config builds them;
    # LayerNorm2d too), not imported: models/utils is below them
    with torch.device('meta'), DefaultScope.overwrite_default_scope('mmdet'):
        for prefix, name in (('backbone', 'CPVT'), ('neck', 'ViTSimpleFPN')):
            if config.get(prefix) is None:
                continue
            model = MODELS.build(dict(config[prefix], type=name))
            want.update({f'{prefix}.{k}': tuple(v.shape)
                         for k, v in model.state_dict().items()})
    missing = sorted(set(want) - set(converted))
    extra = sorted(set(converted) - set(want))
    wrong = [f'{k}: {tuple(v.shape)} != {want[k]}'
             for k, v in converted.items()
             if k in want and tuple(v.shape) != want[k]]
    if missing or extra or wrong:
        raise ValueError(
            'vitdet_d2_to_mmpe: the weights do not fit the model of the '
            f'config; missing {missing[:10]}, unexpected {extra[:10]}, '
            f'shapes {wrong[:10]}')
