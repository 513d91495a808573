"""Convert the iRPE authors' DeiT-with-iRPE checkpoints to mmpe's ``CPVT``.

The authors' ImageNet models (microsoft/Cream, ``iRPE/DeiT-with-iRPE``,
``rpe_models.py``; e.g. ``deit_small_patch16_224_ctx_product_50_shared_k``)
are DeiT ViTs with a class token, a learnable absolute table AND iRPE in
every block (the class token is a skip token with its own bucket). Their
``main.py`` saves ``{'model': state_dict, 'args': Namespace, ...}``; a bare
state dict is accepted too. Every key is placed by one rule below, or the
conversion stops with a ``ValueError`` naming the key:

- ``patch_embed.proj.*`` -> ``patch_embed.*`` (a Conv2d in both);
  ``cls_token``, ``pos_embed`` (1, 1 + 14 * 14, C), ``norm.*`` and
  ``blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}.*`` keep
  their names (CPVT resamples ``pos_embed`` to other grids);
- ``blocks.N.attn.rpe_{q,k,v}[.rp_rows|.rp_cols].lookup_table_{weight,bias}``
  -> ``blocks.N.attn.rpe_{q,k,v}.table``. The authors' layouts (their
  ``iRPE.reset_parameters``): contextual q / k (H', head_dim, nb), v
  (H', nb, head_dim), bias (H', nb); mmpe's ``iRPE.table`` is contextual
  (H', nb, head_dim), bias (H', nb), and for the cross method the row-axis
  buckets then the column-axis buckets. H' = 1 for a shared head, nb counts
  the skip bucket (the last one in both codes);
- ``head.*`` (and a distilled model's ``head_dist.*``): the ImageNet
  classifier, dropped.

The matching CPVT config is printed: sizes from the tensor shapes, iRPE
settings from the model name (``--name``, else ``args.model`` saved in the
checkpoint, else the file name) or from ``--method`` / ``--ratio``::

    python tools/model_converters/deit_irpe_to_mmpe.py \\
        deit_small_patch16_224_ctx_product_50_shared_k.pth \\
        checkpoints/deit_small_patch16_224_ctx_product_50_shared_k_mmpe.pth
"""
import argparse
import os
import os.path as osp
import re
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Tuple

import torch

from mmpe.models.layers.irpe.index import BucketSpec, num_buckets_per_table
from mmpe.models.utils.irpe_authors import authors_table_to_mmpe

# the authors' model list (rpe_models.py): '{method}_{N}' of the name ->
# the ratio its get_rpe_config gets (N is not a function of the ratio)
KNOWN_RATIOS = {
    ('product', '50'): 1.9,
    ('euc', '20'): 20.,
    ('quant', '51'): 33.,
    ('cross', '56'): 20.,
}
METHODS = dict(
    euc='euclidean', quant='quant', cross='cross', product='product')
MODES = dict(ctx='contextual', bias='bias')
# DeiT-{Ti,S,B} (the authors' models.py): heads; the shapes give the rest
SIZES = dict(tiny=3, small=6, base=12)
NAME_RE = re.compile(
    r'deit_(?P<size>tiny|small|base)_patch(?P<patch>\d+)_(?P<img>\d+)_'
    r'(?P<mode>ctx|bias)_(?P<method>euc|quant|cross|product)_(?P<n>\d+)_'
    r'shared_(?P<on>qkv|qk|qv|kv|q|k|v)')  # longest first

_P = r'(?P<p>weight|bias)'
# (full-match pattern, new key) for every non-table key of the release
RULES: List[Tuple['re.Pattern', Optional[Callable[['re.Match'], str]]]] = [
    (r'patch_embed\.proj\.' + _P, lambda m: f'patch_embed.{m["p"]}'),
    (r'cls_token|pos_embed', lambda m: m[0]),
    (r'blocks\.\d+\.(?:norm1|attn\.qkv|attn\.proj|norm2|mlp\.fc1|mlp\.fc2)\.'
     + _P, lambda m: m[0]),
    (r'norm\.' + _P, lambda m: m[0]),
    (r'head(?:_dist)?\.' + _P, None),  # the ImageNet classifier: dropped
]
RULES = [(re.compile(p), f) for p, f in RULES]
TABLE_RE = re.compile(r'blocks\.(?P<n>\d+)\.attn\.rpe_(?P<on>[qkv])\.'
                      r'(?:(?P<axis>rp_rows|rp_cols)\.)?'
                      r'lookup_table_(?P<kind>weight|bias)')
# keys of the authors' models that CPVT has no place for, and why
UNSUPPORTED = [
    (re.compile(r'dist_token'),
     "a distilled DeiT's distillation token (CPVT has one class token)"),
    (re.compile(r'patch_embed\.backbone\..*'),
     'a hybrid (CNN stem) ViT; CPVT embeds patches with one convolution'),
]


def _table(key: str, on: str, kind: str, value: torch.Tensor) -> torch.Tensor:
    """One authors' table in mmpe's layout."""
    return authors_table_to_mmpe(key, on, kind, value)


def _rename(key: str) -> Tuple[bool, Optional[str]]:
    """(placed, new key or None when dropped) of a non-table key."""
    for pattern, why in UNSUPPORTED:
        if pattern.fullmatch(key):
            raise ValueError(f'Cannot convert {key!r}: it belongs to {why}')
    for pattern, rename in RULES:
        match = pattern.fullmatch(key)
        if match:
            return True, None if rename is None else rename(match)
    raise ValueError(f'Unrecognised key {key!r} in the source checkpoint: no '
                     'rule of the DeiT-with-iRPE layout places it')


def convert(src: Dict[str, torch.Tensor],
            log: Optional[Callable[[str], None]] = print
            ) -> 'OrderedDict[str, torch.Tensor]':
    """Map an authors' DeiT-with-iRPE state dict onto mmpe's ``CPVT``.

    Args:
        src (dict[str, Tensor]): The authors' ``checkpoint['model']`` (a
            ``module.`` prefix is stripped).
        log (callable, optional): Receives the summary lines. Defaults to
            ``print``; None is silent.

    Returns:
        OrderedDict[str, Tensor]: CPVT state dict.

    Raises:
        ValueError: Naming the first key that cannot be placed.
    """
    out: 'OrderedDict[str, torch.Tensor]' = OrderedDict()
    tables: Dict[Tuple[int, str], Dict[str, Tuple[str, torch.Tensor]]] = {}
    dropped: List[str] = []
    for key, value in src.items():
        key = key[len('module.'):] if key.startswith('module.') else key
        match = TABLE_RE.fullmatch(key)
        if match:
            parts = tables.setdefault((int(match['n']), match['on']), {})
            axis = match['axis'] or 'single'
            if parts and (axis in parts or 'single' in parts
                          or axis == 'single'):
                raise ValueError(f'{key}: clashes with '
                                 f'{[p[0] for p in parts.values()]}')
            parts[axis] = (key, tuple(value.shape),
                           _table(key, match['on'], match['kind'], value))
            continue
        _, new_key = _rename(key)
        if new_key is None:
            dropped.append(key)
            continue
        if new_key in out:
            raise ValueError(f'{key}: {new_key} is already converted')
        out[new_key] = value

    per_block: Dict[int, List[str]] = {}
    for (block, on), parts in sorted(tables.items()):
        if 'single' in parts:
            key, shape, table = parts['single']
        else:
            if set(parts) != {'rp_rows', 'rp_cols'}:
                key = next(iter(parts.values()))[0]
                raise ValueError(f'{key}: the cross method needs both '
                                 'rp_rows and rp_cols tables, got only '
                                 f'{sorted(parts)}')
            (key, shape, rows), (_, _, cols) = (parts['rp_rows'],
                                                parts['rp_cols'])
            if rows.shape != cols.shape:
                raise ValueError(f'{key}: shape {tuple(rows.shape)} != '
                                 f'rp_cols shape {tuple(cols.shape)}')
            table = torch.cat([rows, cols], dim=1)  # rows then cols buckets
        out[f'blocks.{block}.attn.rpe_{on}.table'] = table
        per_block.setdefault(block, []).append(
            f'rpe_{on} {key.split(".", 4)[-1]} {shape} -> table '
            f'{tuple(table.shape)}')
    blocks = {int(k.split('.')[1]) for k in out if k.startswith('blocks.')}
    if per_block and (set(per_block) != blocks
                      or len({tuple(_shapes(out, b)) for b in blocks}) > 1):
        raise ValueError(
            'The blocks hold different iRPE tables, which one CPVT config '
            f'cannot build: {dict(sorted(per_block.items()))}')

    if log is not None:
        log(f'converted {len(out)} tensors ({len(blocks)} blocks, '
            f'{sum(len(v) for v in per_block.values())} iRPE tables)')
        if per_block:
            first = min(per_block)
            log(f'  every block as block {first}: '
                + '; '.join(per_block[first]))
        else:
            log('  no iRPE tables (a plain DeiT checkpoint)')
        if dropped:
            log(f'  dropped the ImageNet classifier: {", ".join(dropped)}')
    return out


def _shapes(state: Dict[str, torch.Tensor], block: int) -> List:
    prefix = f'blocks.{block}.attn.rpe_'
    return sorted((k[len(f'blocks.{block}.'):], tuple(v.shape))
                  for k, v in state.items() if k.startswith(prefix))


def parse_model_name(name: str) -> Optional[Dict]:
    """iRPE settings in an authors' model name, or None if there are none.

    ``deit_{size}_patch{p}_{img}_{ctx|bias}_{method}_{N}_shared_{on}`` (their
    ``rpe_models.py``); the ratio is known for the names of their model list
    (``KNOWN_RATIOS``), else ``ratio`` is None.

    Returns:
        dict: ``num_heads``, ``patch_size``, ``img_size``, ``mode``,
        ``method``, ``ratio``, ``shared_head``, ``rpe_on``.
    """
    match = NAME_RE.search(name)
    if match is None:
        return None
    return dict(
        num_heads=SIZES[match['size']],
        patch_size=int(match['patch']),
        img_size=int(match['img']),
        mode=MODES[match['mode']],
        method=METHODS[match['method']],
        ratio=KNOWN_RATIOS.get((match['method'], match['n'])),
        shared_head=True,
        rpe_on=match['on'])


def buckets_per_table(method: str, ratio: float, skip: int) -> int:
    """The authors' ``get_num_buckets`` (+1 with a skip token): ``(2b+1)^2``
    for product, else ``2b + 1`` per table, ``b = int(2 * ratio)``."""
    return num_buckets_per_table(BucketSpec(method, 'piecewise', ratio), skip)


def cpvt_config(state: Dict[str, torch.Tensor],
                setting: Optional[Dict] = None,
                num_heads: Optional[int] = None) -> Dict:
    """The ``CPVT`` arguments that load ``state`` (a converted state dict).

    Sizes come from the shapes; ``setting`` (see :func:`parse_model_name`;
    ``method`` and ``ratio`` are needed when there are tables) gives the
    iRPE method and ratio and is checked against the tables.

    Raises:
        ValueError: When the shapes, the setting and ``num_heads`` disagree,
            or a needed value is unknown.
    """
    setting = dict(setting or {})
    patch = state['patch_embed.weight']
    dims = patch.shape[0]
    depth = 1 + max(int(k.split('.')[1]) for k in state
                    if k.startswith('blocks.'))
    use_cls_token = 'cls_token' in state
    skip = int(use_cls_token)
    cfg = dict(
        type='CPVT',
        arch=dict(
            embed_dims=dims,
            depth=depth,
            num_heads=None,
            mlp_ratio=state['blocks.0.mlp.fc1.weight'].shape[0] / dims),
        img_size=None,
        patch_size=patch.shape[-1],
        in_channels=patch.shape[1],
        pos_encoding=None,
        use_cls_token=use_cls_token,
        qkv_bias='blocks.0.attn.qkv.bias' in state,
        norm_cfg=dict(type='LN', eps=1e-6))  # DeiT's LayerNorm (models.py)
    heads = {'name': setting.get('num_heads'), '--num-heads': num_heads}
    tables = {k.split('.')[3][-1]: v for k, v in state.items()
              if k.startswith('blocks.0.attn.rpe_')}
    rpe_on = ''.join(on for on in 'qkv' if on in tables)
    rpe_cfg = None
    if tables:
        for what in ('method', 'ratio'):
            if setting.get(what) is None:
                raise ValueError(
                    f'The iRPE {what} is not in the shapes: give the '
                    "authors' model name (--name) or --method and --ratio")
        first = next(iter(tables.values()))
        mode = 'contextual' if first.dim() == 3 else 'bias'
        shared = first.shape[0] == 1
        nb = buckets_per_table(setting['method'], setting['ratio'], skip)
        nb *= 2 if setting['method'] == 'cross' else 1
        for on, table in tables.items():
            if table.shape[1] != nb:
                raise ValueError(
                    f'blocks.0.attn.rpe_{on}.table has {table.shape[1]} '
                    f'buckets; method {setting["method"]!r} with ratio '
                    f'{setting["ratio"]} and skip {skip} gives {nb}')
            if mode == 'contextual':
                heads[f'rpe_{on} head_dim'] = dims // table.shape[2]
            if not shared:
                heads[f'rpe_{on} heads'] = table.shape[0]
        for what, value in (('mode', mode), ('shared_head', shared),
                            ('rpe_on', rpe_on)):
            if setting.get(what, value) != value:
                raise ValueError(f'The tables say {what}={value!r}, the '
                                 f'model name {setting[what]!r}')
        rpe_cfg = dict(
            mode=mode,
            method=setting['method'],
            ratio=setting['ratio'],
            shared_head=shared,
            rpe_on=rpe_on)
    known = {k: v for k, v in heads.items() if v is not None}
    if len(set(known.values())) != 1:
        raise ValueError(
            'Cannot tell num_heads' + (f': {known} disagree' if known else
                                       ' from the shapes: pass --num-heads'))
    cfg['arch']['num_heads'] = next(iter(known.values()))
    if 'pos_embed' in state:
        grid = state['pos_embed'].shape[1] - skip
        side = int(round(grid**0.5))
        if side * side != grid:
            raise ValueError(f'pos_embed: {grid} grid rows after {skip} '
                             'class row(s) are not a square grid')
        cfg['img_size'] = side * cfg['patch_size']
    else:
        cfg['img_size'] = setting.get('img_size', 224)
    encodings = [e for e, used in (('learnable', 'pos_embed' in state),
                                   ('irpe', rpe_cfg is not None)) if used]
    cfg['pos_encoding'] = tuple(encodings) if len(encodings) > 1 else (
        encodings[0] if encodings else 'none')
    if rpe_cfg is not None:
        cfg['rpe_cfg'] = rpe_cfg
    return cfg


def load_authors_checkpoint(path: str) -> Tuple[Dict, Optional[str]]:
    """(state dict, ``args.model`` or None) of an authors' checkpoint.

    Loaded weights-only; ``argparse.Namespace`` (the training arguments
    saved beside the weights) is the one extra class allowed: building it
    runs no code.
    """
    with torch.serialization.safe_globals([argparse.Namespace]):
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    if not isinstance(ckpt, dict):
        raise ValueError(f'{path}: expected a dict, got {type(ckpt)}')
    if isinstance(ckpt.get('model'), dict):
        return ckpt['model'], getattr(ckpt.get('args'), 'model', None)
    if all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        return ckpt, None  # a bare state dict
    raise ValueError(f'{path}: neither a state dict nor a dict with a '
                     '"model" state dict (the authors\' main.py format)')


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('src', help='the authors\' checkpoint')
    parser.add_argument('dst', help='where to write the mmpe checkpoint')
    parser.add_argument(
        '--name',
        help='the authors\' model name, e.g. deit_small_patch16_224_ctx_'
        'product_50_shared_k (default: args.model in the checkpoint, else '
        'the file name)')
    parser.add_argument('--method', choices=sorted(set(METHODS.values())))
    parser.add_argument('--ratio', type=float)
    parser.add_argument('--num-heads', type=int)
    args = parser.parse_args(argv)

    src, saved_name = load_authors_checkpoint(args.src)
    name = args.name or saved_name or osp.basename(args.src)
    setting = parse_model_name(name)
    if args.name and setting is None:
        raise ValueError(f'--name {args.name!r} is not an authors\' model '
                         'name deit_{tiny|small|base}_patch16_224_{ctx|bias}'
                         '_{method}_{N}_shared_{q|k|v|qk|qkv...}')
    setting = setting or {}
    for what in ('method', 'ratio'):
        value = getattr(args, what)
        if value is not None:
            if setting.get(what) not in (None, value):
                raise ValueError(f'--{what} {value!r} contradicts the model '
                                 f'name {name!r} ({setting[what]!r})')
            setting[what] = value
    print(f'{args.src}: model name {name!r} -> iRPE setting {setting}')
    state_dict = convert(src)
    cfg = cpvt_config(state_dict, setting, args.num_heads)
    print('  CPVT config (add out_indices etc. for your detector):\n'
          f'    backbone={cfg}')
    if osp.dirname(args.dst):
        os.makedirs(osp.dirname(args.dst), exist_ok=True)
    torch.save(
        dict(meta=dict(converted_from=args.src, model_name=name, cpvt=cfg),
             state_dict=state_dict), args.dst)
    print(f'wrote {len(state_dict)} tensors to {args.dst}')


if __name__ == '__main__':
    main()
