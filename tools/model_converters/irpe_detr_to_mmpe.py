"""Convert the iRPE authors' released DETR-iRPE checkpoints to mmpe.

The authors' DETR code (built on facebookresearch/detr) stores
``{'model': state_dict, ...}`` with keys such as
``backbone.0.body.layer1.0.conv1.weight``, ``input_proj.weight``,
``transformer.encoder.layers.N.self_attn.in_proj_weight``,
``transformer.encoder.layers.N.self_attn.rpe_k.lookup_table_weight`` (a
contextual table of shape (H', head_dim, num_buckets); bias tables are
(H', num_buckets), value tables (H', num_buckets, head_dim); the cross
method has ``rpe_k.rp_rows`` / ``rpe_k.rp_cols``), ``query_embed.weight``,
``class_embed.*`` (91 COCO ids + "no object") and ``bbox_embed.layers.*``.
This script maps them onto ``iRPEDETR`` (configs/detr_irpe_ctx*_r50_*.py):
mmdet's ResNet / ChannelMapper / DETRHead names, tables transposed into
``(H', num_buckets, head_dim)``, classifier rows reordered to mmdet's 80
classes plus background.

    python tools/model_converters/irpe_detr_to_mmpe.py SRC.pth DST.pth
"""
import argparse
import re
from collections import OrderedDict
from typing import Dict, List, Tuple

import torch

# COCO category ids of mmdet's 80 classes, in mmdet's order.
COCO_IDS = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21,
    22, 23, 24, 25, 27, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42,
    43, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61,
    62, 63, 64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84,
    85, 86, 87, 88, 89, 90
]
NO_OBJECT = 91  # DETR's last class_embed row

# (pattern, replacement) applied in order to the authors' key names.
RENAMES: List[Tuple[str, str]] = [
    (r'^backbone\.0\.body\.', 'backbone.'),
    (r'^input_proj\.', 'neck.convs.0.conv.'),
    (r'^query_embed\.', 'query_embedding.'),
    (r'^transformer\.encoder\.', 'encoder.'),
    (r'^transformer\.decoder\.norm\.', 'decoder.post_norm.'),
    (r'^transformer\.decoder\.', 'decoder.'),
    (r'\.multihead_attn\.(in_proj|out_proj)', r'.cross_attn.attn.\1'),
    (r'\.self_attn\.(in_proj|out_proj)', r'.self_attn.attn.\1'),
    (r'\.linear1\.', '.ffn.layers.0.0.'),
    (r'\.linear2\.', '.ffn.layers.1.'),
    (r'\.norm1\.', '.norms.0.'),
    (r'\.norm2\.', '.norms.1.'),
    (r'\.norm3\.', '.norms.2.'),
    (r'^class_embed\.', 'bbox_head.fc_cls.'),
    (r'^bbox_embed\.layers\.0\.', 'bbox_head.reg_ffn.layers.0.0.'),
    (r'^bbox_embed\.layers\.1\.', 'bbox_head.reg_ffn.layers.1.'),
    (r'^bbox_embed\.layers\.2\.', 'bbox_head.fc_reg.'),
]
TABLE_RE = re.compile(r'\.(rpe_[qkv])(\.rp_(rows|cols))?\.lookup_table_weight$')


def convert_table(letter: str, table: torch.Tensor) -> torch.Tensor:
    """Authors' table layout -> :class:`mmpe.models.layers.iRPE`'s.

    Args:
        letter (str): 'q', 'k' or 'v'.
        table (Tensor): bias (H', nb); contextual q / k (H', head_dim, nb);
            contextual v (H', nb, head_dim).

    Returns:
        Tensor: bias (H', nb) or contextual (H', nb, head_dim).
    """
    if table.dim() == 3 and letter in 'qk':
        return table.transpose(1, 2).contiguous()
    return table


def convert(src: Dict[str, torch.Tensor],
            num_classes: int = 80) -> 'OrderedDict[str, torch.Tensor]':
    """Map an authors' DETR-iRPE state dict onto mmpe's ``iRPEDETR``.

    Args:
        src (dict[str, Tensor]): The authors' ``checkpoint['model']``.
        num_classes (int): 80 reorders the 92-way COCO classifier to mmdet's
            81 outputs; any other value keeps the classifier as it is.

    Returns:
        OrderedDict[str, Tensor]: mmpe state dict.

    Raises:
        KeyError: If a key is not recognised (nothing is dropped silently).
    """
    out: 'OrderedDict[str, torch.Tensor]' = OrderedDict()
    cross_parts: Dict[str, Dict[str, torch.Tensor]] = {}
    for key, value in src.items():
        match = TABLE_RE.search(key)
        if match:
            prefix = key[:match.start()]
            for pattern, repl in RENAMES:
                prefix = re.sub(pattern, repl, prefix)
            letter = match.group(1)[-1]
            new_key = f'{prefix}.{match.group(1)}.table'
            table = convert_table(letter, value)
            if match.group(3):  # cross: rows then cols, stacked
                cross_parts.setdefault(new_key, {})[match.group(3)] = table
            else:
                out[new_key] = table
            continue
        new_key = key
        for pattern, repl in RENAMES:
            new_key = re.sub(pattern, repl, new_key)
        if new_key == key and not key.startswith('backbone.'):
            raise KeyError(f'Unrecognised key {key!r} in the source '
                           'checkpoint: not a DETR-iRPE state dict?')
        if new_key.startswith('bbox_head.fc_cls.') and num_classes == 80 \
                and value.shape[0] == NO_OBJECT + 1:
            value = value[COCO_IDS + [NO_OBJECT]]
        out[new_key] = value
    for new_key, parts in cross_parts.items():
        if set(parts) != {'rows', 'cols'}:
            raise KeyError(f'{new_key}: the cross method needs rp_rows and '
                           f'rp_cols tables, got {sorted(parts)}')
        out[new_key] = torch.cat([parts['rows'], parts['cols']], dim=1)
    return out


def load_authors_checkpoint(path: str) -> Dict[str, torch.Tensor]:
    """Load ``{'model': ..., 'args': Namespace, ...}`` weights-only.

    ``argparse.Namespace`` (the training arguments saved beside the weights)
    is the one extra class allowed: building it runs no code.
    """
    with torch.serialization.safe_globals([argparse.Namespace]):
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    return ckpt['model'] if 'model' in ckpt else ckpt


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
    state_dict = convert(load_authors_checkpoint(args.src), args.num_classes)
    torch.save(
        dict(meta=dict(converted_from=args.src), state_dict=state_dict),
        args.dst)
    print(f'wrote {len(state_dict)} tensors to {args.dst}')


if __name__ == '__main__':
    main()
