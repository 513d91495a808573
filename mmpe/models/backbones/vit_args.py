"""Argument checks of the plain-ViT backbone (:class:`CPVT`).

Pure functions: each takes a user value and returns it normalised, or raises
a ``ValueError`` naming the field, the value and the valid choices. The
``pos_encoding`` vocabulary and its parser, which the weight converters share,
are :mod:`mmpe.models.utils.vit_pos_encodings`.
"""
from typing import Optional, Sequence, Tuple, Union

from ...utils.arg_checks import check_int, is_int
from ..layers.common.arg_checks import RPE_ON_CHOICES, check_choice
from ..layers.encodings.pos_embed_2d import POS_EMBED_INTERPS
from ..layers.encodings.rope_coords import COORD_DEFAULTS, ROPE_ARGS
from ..layers.grid_bias.build import check_bias_cfg, layer_bias_cfg
from ..layers.windows.window import WINDOW_PADDINGS
from ..utils.vit_pos_encodings import ATTENTION_ENCODINGS, BIAS_ENCODINGS


def parse_rpe_cfg(rpe_cfg: Optional[dict], encodings: Tuple[str, ...],
                  num_skip: int) -> Tuple[Optional[dict], str]:
    """iRPE arguments of every block and ``rpe_on`` (None, 'k' without iRPE).

    Defaults ``dict(mode='contextual', method='product', ratio=1.9,
    rpe_on='k')``; ``skip`` is the number of class tokens.
    """
    if 'irpe' not in encodings:
        if rpe_cfg is not None:
            raise ValueError(
                f"`rpe_cfg` is only used with 'irpe' in `pos_encoding`, got "
                f'pos_encoding={encodings!r}')
        return None, 'k'
    cfg = dict(mode='contextual', method='product', ratio=1.9, rpe_on='k')
    cfg.update(rpe_cfg or {})
    rpe_on = cfg.pop('rpe_on')
    if rpe_on not in RPE_ON_CHOICES:
        raise ValueError(f'Unsupported `rpe_cfg.rpe_on` {rpe_on!r}, '
                         f'please choose from {RPE_ON_CHOICES}')
    for key in ('head_dim', 'num_heads', 'on'):
        if key in cfg:
            raise ValueError(
                f'`rpe_cfg.{key}` is set by CPVT; remove it (use '
                f'`rpe_cfg.rpe_on` to choose q/k/v)')
    if cfg.get('skip', num_skip) != num_skip:
        raise ValueError(
            f"`rpe_cfg.skip` ({cfg['skip']}) must equal the number of "
            f'skip tokens ({num_skip}, from use_cls_token); leave it out')
    cfg['skip'] = num_skip
    return cfg, rpe_on


def parse_rel_pos_cfg(rel_pos_cfg: Optional[dict], encodings: Tuple[str, ...],
                      use_cls_token: bool,
                      pretrain_grid: Tuple[int, int]) -> Optional[dict]:
    """Arguments of the global blocks' ``DecomposedRelPos`` (None without
    ``'rel-pos'``): ``input_size`` (their tables' grid; default the
    pre-training grid ``img_size // patch_size``) and ``init``."""
    if 'rel-pos' not in encodings:
        if rel_pos_cfg is not None:
            raise ValueError(
                f"`rel_pos_cfg` {rel_pos_cfg!r} is only used with 'rel-pos' "
                f'in `pos_encoding`, got pos_encoding={encodings!r}; add '
                "'rel-pos' to `pos_encoding` or leave `rel_pos_cfg` out")
        return None
    if use_cls_token:
        raise ValueError(
            "`use_cls_token=True` with 'rel-pos' in `pos_encoding`: the "
            'decomposed relative position has no entry for a class token '
            '(ViTDet has none); choose use_cls_token=False or another '
            f'encoding of {ATTENTION_ENCODINGS}')
    if rel_pos_cfg is not None and not isinstance(rel_pos_cfg, dict):
        raise ValueError(f'Unsupported `rel_pos_cfg` {rel_pos_cfg!r}, please '
                         "give None or a dict with keys from ('input_size', "
                         "'init')")
    cfg = dict(rel_pos_cfg or {})
    unknown = sorted(set(cfg) - {'input_size', 'init'})
    if unknown:
        raise ValueError(f'`rel_pos_cfg` keys {unknown} are not used, please '
                         "choose from ('input_size', 'init')")
    cfg.setdefault('input_size', tuple(pretrain_grid))
    return cfg


def parse_bias_cfg(bias_cfg: Optional[dict], encodings: Tuple[str, ...],
                   pretrain_grid: Tuple[int, int]) -> Optional[dict]:
    """The global blocks' ``bias_cfg`` (with its ``type``, the offset bias
    named in ``encodings``; None without one). ``bias_cfg`` gives that
    type's arguments; log-CPB's ``pretrained_size`` defaults to the
    pre-training grid ``img_size // patch_size``."""
    kinds = [name for name in encodings if name in BIAS_ENCODINGS]
    if not kinds:
        if bias_cfg is not None:
            raise ValueError(
                f'`bias_cfg` {bias_cfg!r} is only used with one of '
                f'{BIAS_ENCODINGS} in `pos_encoding`, got pos_encoding='
                f'{encodings!r}')
        return None
    if bias_cfg is not None and (not isinstance(bias_cfg, dict)
                                 or 'type' in bias_cfg):
        raise ValueError(
            f'Unsupported `bias_cfg` {bias_cfg!r}, please give None or a '
            f'dict of the arguments of {kinds[0]!r} (the type is the '
            '`pos_encoding` name)')
    cfg = dict(bias_cfg or {}, type=kinds[0])
    if kinds[0] == 'log-cpb':
        cfg.setdefault('pretrained_size', tuple(pretrain_grid))
    return check_bias_cfg(cfg)


#: ``rope_cfg`` keys of the backbone beside those of :data:`ROPE_ARGS`
BACKBONE_ROPE_ARGS = ('scale', 'window_scale')


def parse_rope_cfg(rope_cfg: Optional[dict], rope_theta: Optional[float],
                   encodings: Tuple[str, ...]) -> Tuple[dict, Optional[dict]]:
    """The rotary module's arguments and the token-coordinate arguments.

    ``rope_cfg`` takes the keys of ``encoder_pe.relative`` of the rotary
    type in ``encodings`` (:data:`~mmpe.models.layers.encodings.rope_coords.ROPE_ARGS`:
    ``theta``, ``rotate`` for RoPE-Mixed, and the coordinates ``coords``,
    ``normalize``, ``shift``, ``jitter``, ``rescale``) and the backbone's
    :data:`BACKBONE_ROPE_ARGS` (``scale``: positions times a factor, one or
    per axis; ``window_scale``: the factor of the window blocks, EVA-02's
    window RoPE; None: ``scale``); ``rope_theta`` is
    the older spelling of ``rope_cfg.theta`` (both may be given only with
    the same value). The coordinate values are checked where they are used
    (:class:`~mmpe.models.layers.encodings.rope_coords.RoPECoords`).

    Returns:
        tuple[dict, dict | None]: The keyword arguments of ``RoPE2D`` /
        ``RoPEMixed`` besides the head sizes (``theta`` only when given),
        and the coordinate arguments (defaults filled in, with ``scale`` and
        ``window_scale`` where given); ``({}, None)`` without a rotary
        encoding.
    """
    kinds = [name for name in encodings if name in ROPE_ARGS]
    if not kinds:
        if rope_cfg is not None:
            raise ValueError(
                f'`rope_cfg` is only used with one of {tuple(ROPE_ARGS)} in '
                f'`pos_encoding`, got pos_encoding={encodings!r}')
        return {}, None
    cfg = {} if rope_cfg is None else rope_cfg
    if not isinstance(cfg, dict):
        raise ValueError(f'Unsupported `rope_cfg` {rope_cfg!r}, please give '
                         f'None or a dict with keys from '
                         f'{ROPE_ARGS[kinds[0]]}')
    allowed = ROPE_ARGS[kinds[0]] + BACKBONE_ROPE_ARGS
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        raise ValueError(
            f'Unsupported `rope_cfg` keys {unknown} for pos_encoding '
            f'{kinds[0]!r}, please choose from {allowed}')
    theta = cfg.get('theta', rope_theta)
    if rope_theta is not None and theta != rope_theta:
        raise ValueError(
            f'`rope_theta` ({rope_theta!r}) and `rope_cfg.theta` '
            f'({theta!r}) conflict; please give the frequency base once, '
            'as `rope_cfg.theta`')
    module_cfg = {k: cfg[k] for k in ('rotate', ) if k in cfg}
    if theta is not None:
        module_cfg['theta'] = theta
    coords = {k: cfg.get(k, v) for k, v in COORD_DEFAULTS.items()}
    coords['scale'] = cfg.get('scale', 1.)
    if cfg.get('window_scale') is not None:
        coords['window_scale'] = cfg['window_scale']
    return module_cfg, coords


def check_rates(**rates: float) -> None:
    """Raise unless every dropout-like rate lies in [0, 1)."""
    for name, rate in rates.items():
        if not 0 <= rate < 1:
            raise ValueError(f'`{name}` must be in [0, 1), got {rate}')


def parse_img_size(img_size: Union[int, Tuple[int, int]]) -> Tuple[int, int]:
    """``img_size`` as a pair of positive ints."""
    img_size = (img_size, img_size) if is_int(img_size) else img_size
    if (not isinstance(img_size, (list, tuple)) or len(img_size) != 2
            or not all(is_int(s, 1) for s in img_size)):
        raise ValueError(f'`img_size` must be a positive int or a pair of '
                         f'them, got {img_size!r}')
    return tuple(img_size)


def check_arch(arch: dict, patch_size: int, in_channels: int) -> None:
    """Raise unless the sizes are positive ints, ``num_heads`` divides
    ``embed_dims`` and ``mlp_ratio > 0``."""
    for name, value in (('embed_dims', arch['embed_dims']),
                        ('depth', arch['depth']),
                        ('num_heads', arch['num_heads']),
                        ('patch_size', patch_size),
                        ('in_channels', in_channels)):
        check_int(name, value)
    embed_dims, num_heads = arch['embed_dims'], arch['num_heads']
    if embed_dims % num_heads != 0:
        raise ValueError(
            f'`num_heads` ({num_heads}) must divide `embed_dims` '
            f'({embed_dims}); choose num_heads among the divisors of '
            f'{embed_dims}')
    if not arch['mlp_ratio'] > 0:
        raise ValueError(f'`mlp_ratio` must be > 0, got {arch["mlp_ratio"]}')


def parse_arch(arch: Union[str, dict], arch_zoo: dict,
               essential_keys: set) -> dict:
    """A copy of the preset ``arch`` of ``arch_zoo``, or the checked dict."""
    if isinstance(arch, str):
        key = arch.lower()
        if key not in arch_zoo:
            raise ValueError(f'Unsupported `arch` {arch!r}, please choose '
                             f'from {sorted(set(arch_zoo))} or pass '
                             f'a dict with keys '
                             f'{sorted(essential_keys)}')
        return dict(arch_zoo[key])
    if isinstance(arch, dict):
        missing = essential_keys - set(arch)
        unknown = set(arch) - essential_keys
        if missing or unknown:
            raise ValueError(
                f'Custom `arch` dict must have exactly the keys '
                f'{sorted(essential_keys)}; missing '
                f'{sorted(missing)}, unknown {sorted(unknown)}')
        return dict(arch)
    raise ValueError(f'`arch` must be a str or a dict, got {arch!r}')

def parse_out_indices(out_indices: Union[int, Sequence[int]],
                       depth: int) -> Tuple[int, ...]:
    """Sorted block indices in ``[0, depth)`` (negatives from the end)."""
    if is_int(out_indices):
        out_indices = [out_indices]
    if not isinstance(out_indices, Sequence) or len(out_indices) == 0:
        raise ValueError(f'`out_indices` must be an int or a non-empty '
                         f'sequence of ints, got {out_indices!r}')
    parsed = []
    for index in out_indices:
        if not is_int(index) or not -depth <= index < depth:
            raise ValueError(
                f'`out_indices` entry {index!r} is out of range: choose '
                f'block indices in [{-depth}, {depth - 1}] (depth '
                f'{depth})')
        parsed.append(index % depth)
    return tuple(sorted(set(parsed)))

def parse_peg_positions(peg_positions: Sequence[int],
                         depth: int) -> Tuple[int, ...]:
    """Sorted blocks followed by a PEG."""
    if is_int(peg_positions):
        peg_positions = [peg_positions]
    if not isinstance(peg_positions, Sequence) or not peg_positions:
        raise ValueError(
            f"`peg_positions` must be a non-empty sequence of block "
            f"indices in [0, {depth - 1}] for pos_encoding='peg' (use "
            f"pos_encoding='none' for no position encoding), got "
            f'{peg_positions!r}')
    for pos in peg_positions:
        if not is_int(pos) or not 0 <= pos < depth:
            raise ValueError(
                f'`peg_positions` entry {pos!r} is out of range: choose '
                f'block indices in [0, {depth - 1}] (depth {depth})')
    return tuple(sorted(set(peg_positions)))


def parse_window_layout(window_size: int, global_blocks: Sequence[int],
                        depth: int,
                        use_cls_token: bool,
                        num_registers: int = 0) -> Tuple[int, Tuple[int, ...]]:
    """``window_size`` and the sorted ``global_blocks`` of ViTDet's layout.

    ``window_size`` is an int >= 0 (0: every block global); ``global_blocks``
    distinct block indices in ``[0, depth)`` (an int is one block). Windows
    take no class or register tokens (ViTDet has none).
    """
    check_int('window_size', window_size, minimum=0,
              hint='0: global attention in every block; ViTDet: 14')
    if is_int(global_blocks):
        global_blocks = [global_blocks]
    if not isinstance(global_blocks, Sequence) or isinstance(
            global_blocks, str):
        raise ValueError(
            f'`global_blocks` must be a sequence of block indices in [0, '
            f'{depth - 1}], got {global_blocks!r}')
    for index in global_blocks:
        if not is_int(index) or not 0 <= index < depth:
            raise ValueError(
                f'`global_blocks` entry {index!r} is out of range: choose '
                f'block indices in [0, {depth - 1}] (depth {depth})')
    repeated = sorted({i for i in global_blocks if global_blocks.count(i) > 1})
    if repeated:
        raise ValueError(
            f'`global_blocks` {tuple(global_blocks)!r} repeats block(s) '
            f'{repeated}: choose distinct block indices in [0, {depth - 1}]')
    if window_size and (use_cls_token or num_registers):
        name = ('`use_cls_token=True`' if use_cls_token else
                f'`num_register_tokens={num_registers}`')
        raise ValueError(
            f'{name} with `window_size={window_size}`: a class or register '
            'token belongs to no window (ViTDet has none); choose '
            'use_cls_token=False and num_register_tokens=0 (the converters '
            'drop them) or window_size=0')
    return window_size, tuple(sorted(global_blocks))


def parse_detectron2_options(window_padding: str, pos_embed_interp: str,
                             encodings: Tuple[str, ...],
                             window_size: int) -> dict:
    """Check ``window_padding`` and ``pos_embed_interp`` (the two choices
    where detectron2's ViTDet computes otherwise than mmpe's defaults) and
    return the :func:`~mmpe.models.layers.resample_pos_embed` keyword
    arguments of ``pos_embed_interp``.

    ``'zeros'`` is refused with a rotary encoding (the zero tokens that pad
    the windows have no row in the RoPE tables; detectron2 has no RoPE) and
    a non-default ``pos_embed_interp`` without a ``'learnable'`` table.
    """
    check_choice('window_padding', window_padding, WINDOW_PADDINGS)
    check_choice('pos_embed_interp', pos_embed_interp,
                 tuple(POS_EMBED_INTERPS))
    rotary = [name for name in encodings if name in ROPE_ARGS]
    if window_padding == 'zeros' and window_size and rotary:
        raise ValueError(
            f"`window_padding='zeros'` with pos_encoding {rotary[0]!r}: the "
            'zero tokens that pad the grid to whole windows have no position '
            "in the RoPE tables (detectron2's ViTDet, which pads with zeros, "
            "has no RoPE); choose window_padding='masked' or another "
            f'encoding than {tuple(ROPE_ARGS)}')
    if pos_embed_interp != 'timm' and 'learnable' not in encodings:
        raise ValueError(
            f'`pos_embed_interp={pos_embed_interp!r}` resamples the '
            "'learnable' table, which pos_encoding "
            f"{encodings!r} does not have; add 'learnable' or leave "
            "pos_embed_interp='timm'")
    return POS_EMBED_INTERPS[pos_embed_interp]


def block_rel_pos_cfg(cfg: Optional[dict], index: int, window_size: int,
                      global_blocks: Tuple[int, ...]) -> Optional[dict]:
    """Block ``index``'s ``rel_pos_cfg``: tables for its window ``(S, S)``
    or, global, for ``cfg['input_size']``."""
    if cfg is None or not window_size or index in global_blocks:
        return cfg
    return dict(cfg, input_size=(window_size, window_size))


def block_bias_cfg(cfg: Optional[dict], index: int, depth: int,
                   window_size: int,
                   global_blocks: Tuple[int, ...]) -> Optional[dict]:
    """Block ``index``'s ``bias_cfg``: LookHere's layer, log-CPB's window
    ``(S, S)`` in a window block."""
    cfg = layer_bias_cfg(cfg, index, depth)
    if (cfg is not None and cfg['type'] == 'log-cpb' and window_size
            and index not in global_blocks):
        cfg = dict(cfg, pretrained_size=(window_size, ) * 2)
    return cfg


#: The keys of ``CPVT(block_cfg=...)``
BLOCK_CFG_KEYS = ('layer_scale_init', 'mlp_type')


def parse_block_cfg(block_cfg: Optional[dict]) -> dict:
    """``block_cfg`` as ``ViTBlock`` keyword arguments (keys of
    :data:`BLOCK_CFG_KEYS`; their values are checked by the block)."""
    if block_cfg is None:
        return {}
    if not isinstance(block_cfg, dict):
        raise ValueError(f'Unsupported `block_cfg` {block_cfg!r}, please give '
                         f'None or a dict with keys from {BLOCK_CFG_KEYS}')
    unknown = sorted(set(block_cfg) - set(BLOCK_CFG_KEYS))
    if unknown:
        raise ValueError(f'`block_cfg` keys {unknown} are not used, please '
                         f'choose from {BLOCK_CFG_KEYS}')
    return dict(block_cfg)
