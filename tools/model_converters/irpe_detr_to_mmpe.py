"""Convert the iRPE authors' DETR-iRPE checkpoints to mmpe's ``iRPEDETR``.

The authors' DETR code (microsoft/Cream, ``iRPE/DETR-with-iRPE``, built on
facebookresearch/detr) saves ``{'model': state_dict, 'args': Namespace, ...}``
from its ``main.py``. Every key of ``model`` is placed by one rule below, or
the conversion stops with a ``ValueError`` naming the key: nothing is dropped.

- ResNet ``backbone.0.body.*`` -> mmdet's ``backbone.*`` (same names; mmdet's
  BatchNorm adds ``num_batches_tracked``, which DETR's FrozenBatchNorm lacks);
  ``input_proj`` -> ``neck.convs.0.conv`` (ChannelMapper);
  ``query_embed`` -> ``query_embedding``.
- ``transformer.{encoder,decoder}.layers.N``: ``self_attn`` /
  ``multihead_attn`` -> ``self_attn.attn`` / ``cross_attn.attn``,
  ``linear1`` / ``linear2`` -> ``ffn.layers.0.0`` / ``ffn.layers.1``,
  ``normI`` -> ``norms.{I-1}``; ``transformer.decoder.norm`` ->
  ``decoder.post_norm``.
- iRPE tables ``...self_attn.rpe_{q,k,v}[.rp_rows|.rp_cols].lookup_table_*``
  -> ``encoder.layers.N.self_attn.rpe_{q,k,v}.table``. The authors' layouts
  (``irpe.py``, ``iRPE.reset_parameters``): bias ``lookup_table_bias``
  (H', nb) on q / k only; contextual ``lookup_table_weight`` (H', head_dim,
  nb) on q / k and (H', nb, head_dim) on v; H' = 1 for a shared head, else
  the number of heads; the cross method keeps one table per axis
  (``rp_rows``, ``rp_cols``). mmpe's ``iRPE.table`` is bias (H', nb) and
  contextual (H', nb, head_dim), cross rows then columns along nb.
- ``class_embed`` (91 COCO ids + "no object" = 92 rows) -> ``bbox_head.fc_cls``
  reordered to mmdet's 80 classes + background; ``bbox_embed.layers.{0,1,2}``
  -> ``bbox_head.reg_ffn.layers.0.0`` / ``reg_ffn.layers.1`` / ``fc_reg``.

    python tools/model_converters/irpe_detr_to_mmpe.py SRC.pth DST.pth
"""
import argparse
import re
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Tuple

import torch

from mmpe.models.layers.irpe.index import BucketSpec, num_buckets_per_table
from mmpe.models.utils.irpe_authors import authors_table_to_mmpe

# COCO category ids of mmdet's 80 classes, in mmdet's order (ids 1-90
# without the 10 ids COCO never annotates).
COCO_IDS = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21,
    22, 23, 24, 25, 27, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42,
    43, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61,
    62, 63, 64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84,
    85, 86, 87, 88, 89, 90
]
NO_OBJECT = 91  # DETR's last class_embed row, mmdet's background column

_P = r'(?P<p>weight|bias)'
_BN = r'(?:weight|bias|running_mean|running_var)'
_RESNET = (r'(?P<rest>(?:conv1\.weight|bn1\.' + _BN + r')|layer[1-4]\.\d+\.'
           r'(?:conv[1-3]\.weight|bn[1-3]\.' + _BN + r'|downsample\.0\.weight'
           r'|downsample\.1\.' + _BN + r'))')
_ATTN = r'(?P<p>in_proj_weight|in_proj_bias|out_proj\.weight|out_proj\.bias)'
_TF = r'transformer\.(?P<part>encoder|decoder)\.layers\.(?P<n>\d+)\.'

# (full-match pattern, new key) for every non-table key of the release.
RULES: List[Tuple['re.Pattern', Callable[['re.Match'], str]]] = [
    (r'backbone\.0\.body\.' + _RESNET, lambda m: f'backbone.{m["rest"]}'),
    (r'input_proj\.' + _P, lambda m: f'neck.convs.0.conv.{m["p"]}'),
    (r'query_embed\.weight', lambda m: 'query_embedding.weight'),
    (_TF + r'self_attn\.' + _ATTN,
     lambda m: f'{m["part"]}.layers.{m["n"]}.self_attn.attn.{m["p"]}'),
    (r'transformer\.decoder\.layers\.(?P<n>\d+)\.multihead_attn\.' + _ATTN,
     lambda m: f'decoder.layers.{m["n"]}.cross_attn.attn.{m["p"]}'),
    (_TF + r'linear1\.' + _P,
     lambda m: f'{m["part"]}.layers.{m["n"]}.ffn.layers.0.0.{m["p"]}'),
    (_TF + r'linear2\.' + _P,
     lambda m: f'{m["part"]}.layers.{m["n"]}.ffn.layers.1.{m["p"]}'),
    (r'transformer\.encoder\.layers\.(?P<n>\d+)\.norm(?P<i>[12])\.' + _P,
     lambda m: f'encoder.layers.{m["n"]}.norms.{int(m["i"]) - 1}.{m["p"]}'),
    (r'transformer\.decoder\.layers\.(?P<n>\d+)\.norm(?P<i>[123])\.' + _P,
     lambda m: f'decoder.layers.{m["n"]}.norms.{int(m["i"]) - 1}.{m["p"]}'),
    (r'transformer\.decoder\.norm\.' + _P,
     lambda m: f'decoder.post_norm.{m["p"]}'),
    (r'class_embed\.' + _P, lambda m: f'bbox_head.fc_cls.{m["p"]}'),
    (r'bbox_embed\.layers\.0\.' + _P,
     lambda m: f'bbox_head.reg_ffn.layers.0.0.{m["p"]}'),
    (r'bbox_embed\.layers\.1\.' + _P,
     lambda m: f'bbox_head.reg_ffn.layers.1.{m["p"]}'),
    (r'bbox_embed\.layers\.2\.' + _P, lambda m: f'bbox_head.fc_reg.{m["p"]}'),
]
RULES = [(re.compile(p), f) for p, f in RULES]
TABLE_RE = re.compile(r'transformer\.encoder\.layers\.(?P<n>\d+)\.self_attn'
                      r'\.rpe_(?P<on>[qkv])\.(?:(?P<axis>rp_rows|rp_cols)\.)?'
                      r'lookup_table_(?P<kind>weight|bias)')
# keys of the release that mmpe's iRPEDETR has no place for, and why
UNSUPPORTED = [
    (re.compile(r'backbone\.1\..*'),
     "a learned position embedding ('--position_embedding learned'); "
     'iRPEDETR uses the sine encoding'),
    (re.compile(r'transformer\.encoder\.norm\..*'),
     "the final encoder LayerNorm of a pre-norm model ('--pre_norm'); "
     "mmdet's DETR layers are post-norm"),
    (re.compile(r'(detr|bbox_attention|mask_head)\..*'),
     "DETR's segmentation head ('--masks')"),
]
METHODS = dict(
    euc='euclidean', quant='quant', cross='cross', product='product')
MODES = dict(ctx='contextual', contextual='contextual', bias='bias')
# the authors' released settings and the mmpe configs that train them
RELEASED_CONFIGS = {
    'rpe-1.9-product-ctx-1-k': 'configs/detr_irpe_ctx_r50_150e.py',
    'rpe-2.0-product-ctx-1-k': 'configs/detr_irpe_ctx-r2.0_r50_150e.py '
    '(150 epochs) or configs/detr_irpe_ctx_r50_300e.py (300 epochs)',
    'rpe-1.9-product-bias-1-k': 'configs/detr_irpe_bias_r50_150e.py',
}


def parse_enc_rpe2d(setting: str) -> Dict:
    """The authors' ``--enc_rpe2d rpe-{ratio}-{method}-{mode}-{shared}-{on}``
    as mmpe's ``rpe_cfg`` plus ``rpe_on``.

    Args:
        setting (str): e.g. ``'rpe-1.9-product-ctx-1-k'``.

    Returns:
        dict: ``mode``, ``method``, ``ratio``, ``shared_head``, ``rpe_on``.
    """
    parts = setting.split('-')
    if len(parts) != 6 or parts[0] != 'rpe' or parts[2] not in METHODS \
            or parts[3] not in MODES or parts[4] not in ('0', '1') \
            or not parts[5] or set(parts[5]) - set('qkv'):
        raise ValueError(
            f'Unsupported enc_rpe2d {setting!r}, please give '
            'rpe-{ratio}-{method}-{mode}-{shared_head}-{rpe_on} with method '
            f'in {tuple(METHODS)}, mode in {tuple(MODES)}, shared_head in '
            "(0, 1), rpe_on made of 'q', 'k', 'v'")
    return dict(
        mode=MODES[parts[3]],
        method=METHODS[parts[2]],
        ratio=float(parts[1]),
        shared_head=parts[4] == '1',
        rpe_on=''.join(c for c in 'qkv' if c in parts[5]))


def buckets_per_table(method: str, ratio: float) -> int:
    """The authors' ``get_num_buckets`` (piecewise index, no skip token):
    ``(2b + 1) ** 2`` for product, else ``2b + 1``, ``b = int(2 * ratio)``.
    """
    return num_buckets_per_table(BucketSpec(method, 'piecewise', ratio))


def _table(key: str, on: str, kind: str, value: torch.Tensor,
           d_model: Optional[int]) -> torch.Tensor:
    """One authors' table in mmpe's layout; checks its rank and head dim."""
    table = authors_table_to_mmpe(key, on, kind, value)
    if kind == 'bias':
        return table
    heads, head_dim = table.shape[0], table.shape[2]
    if d_model is not None and (d_model % head_dim or heads not in (
            1, d_model // head_dim)):
        raise ValueError(
            f'{key}: shape {tuple(value.shape)} does not fit d_model '
            f'{d_model} (expected (1 or heads, head_dim, buckets) on q / k, '
            '(1 or heads, buckets, head_dim) on v)')
    return table


def _check_setting(key: str, on: str, kind: str, table: torch.Tensor,
                   cfg: Dict, nheads: Optional[int]) -> None:
    """Raise if a converted table contradicts the saved ``enc_rpe2d``."""
    # per table (cross: per axis, before rows and cols are stacked)
    expected_nb = buckets_per_table(cfg['method'], cfg['ratio'])
    mode = 'bias' if kind == 'bias' else 'contextual'
    problems = []
    if on not in cfg['rpe_on']:
        problems.append(f"rpe_on is {cfg['rpe_on']!r}")
    if mode != cfg['mode']:
        problems.append(f"mode is {cfg['mode']!r}")
    if table.shape[1] != expected_nb:
        problems.append(f'{expected_nb} buckets expected, got '
                        f'{table.shape[1]}')
    heads = 1 if cfg['shared_head'] else nheads
    if heads is not None and table.shape[0] != heads:
        problems.append(f'{heads} table head(s) expected, got '
                        f'{table.shape[0]}')
    if problems:
        raise ValueError(f'{key} contradicts the checkpoint\'s enc_rpe2d '
                         f'setting: {"; ".join(problems)}')


def _classifier(key: str, value: torch.Tensor,
                num_classes: int) -> Tuple[torch.Tensor, str]:
    rows = value.shape[0]
    if num_classes == 80:
        if rows != NO_OBJECT + 1:
            raise ValueError(
                f'{key}: COCO reordering needs {NO_OBJECT + 1} rows (91 ids '
                f'+ no-object), got {rows}; pass --num-classes {rows - 1} '
                'to keep the classifier as it is')
        dropped = sorted(set(range(NO_OBJECT)) - set(COCO_IDS))
        note = (f'{rows} -> 81 rows: mmdet class i <- COCO id COCO_IDS[i] '
                f'(i < 80), background (80) <- no-object ({NO_OBJECT}); '
                f'unused ids {dropped} dropped')
        return value[COCO_IDS + [NO_OBJECT]].clone(), note
    if rows != num_classes + 1:
        raise ValueError(f'{key}: {rows} rows do not fit --num-classes '
                         f'{num_classes} (+ background)')
    return value.clone(), f'{rows} rows kept in order'


def convert(src: Dict[str, torch.Tensor],
            num_classes: int = 80,
            enc_rpe2d: Optional[str] = None,
            nheads: Optional[int] = None,
            log: Optional[Callable[[str], None]] = print
            ) -> 'OrderedDict[str, torch.Tensor]':
    """Map an authors' DETR-iRPE state dict onto mmpe's ``iRPEDETR``.

    Args:
        src (dict[str, Tensor]): The authors' ``checkpoint['model']``.
        num_classes (int): 80 reorders the 92-row COCO classifier to mmdet's
            80 classes + background; another value keeps the rows (which
            must then be ``num_classes + 1``). Defaults to 80.
        enc_rpe2d (str, optional): The checkpoint's ``args.enc_rpe2d``; when
            given, every table is checked against it. Defaults to None.
        nheads (int, optional): ``args.nheads``, to check per-head tables.
        log (callable, optional): Receives the summary lines. Defaults to
            ``print``; None is silent.

    Returns:
        OrderedDict[str, Tensor]: mmpe state dict.

    Raises:
        ValueError: Naming the first key that cannot be placed.
    """
    cfg = parse_enc_rpe2d(enc_rpe2d) if enc_rpe2d else None
    out: 'OrderedDict[str, torch.Tensor]' = OrderedDict()
    tables: Dict[Tuple[int, str], Dict[str, Tuple[str, torch.Tensor]]] = {}
    counts: Dict[str, int] = {}
    notes: List[str] = []
    for key, value in src.items():
        match = TABLE_RE.fullmatch(key)
        if match:
            layer, on = int(match['n']), match['on']
            d_in = src.get(f'transformer.encoder.layers.{layer}.self_attn.'
                           'in_proj_weight')
            d_model = None if d_in is None else d_in.shape[1]
            table = _table(key, on, match['kind'], value, d_model)
            if cfg is not None:
                _check_setting(key, on, match['kind'], table, cfg, nheads)
            parts = tables.setdefault((layer, on), {})
            axis = match['axis'] or 'single'
            if parts and (axis in parts or 'single' in parts
                          or axis == 'single'):
                raise ValueError(f'{key}: clashes with '
                                 f'{[k for k, _ in parts.values()]}')
            parts[axis] = (key, table)
            continue
        for pattern, why in UNSUPPORTED:
            if pattern.fullmatch(key):
                raise ValueError(f'Cannot convert {key!r}: it belongs to '
                                 f'{why}')
        for pattern, rename in RULES:
            match = pattern.fullmatch(key)
            if match:
                break
        else:
            raise ValueError(f'Unrecognised key {key!r} in the source '
                             'checkpoint: no rule of the DETR-iRPE layout '
                             'places it')
        new_key = rename(match)
        if new_key in out:
            raise ValueError(f'{key}: {new_key} is already converted')
        if new_key.startswith('bbox_head.fc_cls.'):
            value, note = _classifier(key, value, num_classes)
            if new_key.endswith('weight'):
                notes.append(f'classifier class_embed -> bbox_head.fc_cls: '
                             f'{note}')
        out[new_key] = value
        group = new_key.split('.')[0]
        counts[group] = counts.get(group, 0) + 1

    per_layer: Dict[int, List[str]] = {}
    for (layer, on), parts in sorted(tables.items()):
        new_key = f'encoder.layers.{layer}.self_attn.rpe_{on}.table'
        if 'single' in parts:
            key, table = parts['single']
            desc = f'{key.split(".")[-1]} {tuple(src[key].shape)}'
        else:
            if set(parts) != {'rp_rows', 'rp_cols'}:
                key = next(iter(parts.values()))[0]
                raise ValueError(f'{key}: the cross method needs both '
                                 'rp_rows and rp_cols tables, got only '
                                 f'{sorted(parts)}')
            rows, cols = parts['rp_rows'][1], parts['rp_cols'][1]
            if rows.shape != cols.shape:
                raise ValueError(
                    f'{parts["rp_rows"][0]}: shape {tuple(rows.shape)} != '
                    f'rp_cols shape {tuple(cols.shape)}')
            table = torch.cat([rows, cols], dim=1)  # rows then cols buckets
            key = parts['rp_rows'][0]
            desc = (f'rp_rows + rp_cols {key.split(".")[-1]} '
                    f'{tuple(src[key].shape)} x 2')
        out[new_key] = table
        heads = 'shared head' if table.shape[0] == 1 else \
            f'{table.shape[0]} heads'
        per_layer.setdefault(layer, []).append(
            f'rpe_{on} {desc} -> table {tuple(table.shape)} ({heads})')
    layouts = {tuple(v) for v in per_layer.values()}
    enc_layers = {
        int(k.split('.')[2])
        for k in out if k.startswith('encoder.layers.')
    }
    if per_layer and not enc_layers <= set(per_layer):
        raise ValueError(
            f'Encoder layers {sorted(enc_layers - set(per_layer))} have no '
            f'iRPE tables but layers {sorted(per_layer)} do, which one '
            'iRPEDETR config cannot build')
    if len(layouts) > 1:
        raise ValueError('The encoder layers hold different iRPE tables, '
                         'which one iRPEDETR config cannot build: '
                         f'{per_layer}')

    if log is not None:
        log(f'converted {len(out)} tensors: ' + ', '.join(
            f'{g} {n}' for g, n in sorted(counts.items())))
        if per_layer:
            for layer, descs in sorted(per_layer.items()):
                log(f'  encoder layer {layer}: ' + '; '.join(descs))
        else:
            log('  no iRPE tables (a plain DETR checkpoint)')
        for note in notes:
            log('  ' + note)
    return out


def load_authors_checkpoint(path: str) -> Dict:
    """Load ``{'model': ..., 'args': Namespace, ...}`` weights-only.

    ``argparse.Namespace`` (the training arguments saved beside the weights)
    is the one extra class allowed: building it runs no code.
    """
    with torch.serialization.safe_globals([argparse.Namespace]):
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get('model'), dict):
        raise ValueError(f'{path}: expected a dict with a "model" state dict '
                         '(the authors\' main.py format)')
    return ckpt


def _check_args(args) -> None:
    """Refuse training arguments iRPEDETR does not reproduce."""
    for name, ok in (('pre_norm', False), ('masks', False),
                     ('position_embedding', 'sine')):
        value = getattr(args, name, ok)
        if value != ok:
            raise ValueError(f'Unsupported args.{name}={value!r} in the '
                             f'checkpoint: iRPEDETR needs {ok!r}')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('src', help='the authors\' checkpoint')
    parser.add_argument('dst', help='where to write the mmpe checkpoint')
    parser.add_argument(
        '--num-classes',
        type=int,
        default=80,
        help='80 reorders the COCO classifier to mmdet\'s order')
    args = parser.parse_args(argv)
    ckpt = load_authors_checkpoint(args.src)
    train_args = ckpt.get('args')
    enc_rpe2d = getattr(train_args, 'enc_rpe2d', None) or None
    if train_args is not None:
        _check_args(train_args)
    print(f'{args.src}: enc_rpe2d={enc_rpe2d!r}, epoch={ckpt.get("epoch")}')
    state_dict = convert(ckpt['model'], args.num_classes, enc_rpe2d,
                         getattr(train_args, 'nheads', None))
    if enc_rpe2d:
        cfg = parse_enc_rpe2d(enc_rpe2d)
        rpe_on = cfg.pop('rpe_on')
        print(f'  mmpe setting: rpe_cfg={dict(cfg, index="piecewise")}, '
              f'rpe_on={rpe_on!r}; config: '
              f'{RELEASED_CONFIGS.get(enc_rpe2d, "set these in yours")}')
    if getattr(train_args, 'dilation', False):
        print('  DC5 backbone (--dilation): set the ResNet\'s '
              'strides=(1, 2, 2, 1), dilations=(1, 1, 1, 2)')
    torch.save(
        dict(
            meta=dict(converted_from=args.src, enc_rpe2d=enc_rpe2d),
            state_dict=state_dict), args.dst)
    print(f'wrote {len(state_dict)} tensors to {args.dst}')


if __name__ == '__main__':
    main()
