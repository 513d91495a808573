"""Convert a timm DeiT/ViT checkpoint to CPVT backbone weights.

Example (DeiT-Small ImageNet-1k weights, for the ``cpvt-s`` configs)::

    # the DeiT release (a dict with 'model'), or timm's model.safetensors
    wget https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth
    python tools/model_converters/timm_vit_to_cpvt.py \\
        deit_small_patch16_224-cd65a155.pth checkpoints/cpvt-s_deit-in1k.pth

The position table is dropped for ``--pos-encoding peg`` (the default) and
the class token unless ``--use-cls-token``; the PEG is newly initialised
when the backbone loads the file (``init_cfg=dict(type='Pretrained',
checkpoint=...)``).
"""
import argparse
import os
import os.path as osp
from typing import Dict

import torch

from mmpe.models.backbones import CPVT, timm_vit_to_cpvt


def load_timm_state_dict(path: str) -> Dict[str, torch.Tensor]:
    """Read a timm/DeiT checkpoint (``.pth``/``.bin`` or ``.safetensors``)."""
    if path.endswith('.safetensors'):
        from safetensors.torch import load_file
        return load_file(path)
    # weights_only: a tensor-only file never needs code execution to load
    ckpt = torch.load(path, map_location='cpu', weights_only=True)
    for key in ('model', 'state_dict', 'model_ema'):
        if isinstance(ckpt, dict) and key in ckpt and isinstance(
                ckpt[key], dict):
            return ckpt[key]
    return ckpt


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Convert timm DeiT/ViT weights to an mmpe CPVT backbone '
        'checkpoint')
    parser.add_argument('src', help='timm/DeiT checkpoint (.pth/.safetensors)')
    parser.add_argument('dst', help='output .pth for init_cfg Pretrained')
    parser.add_argument(
        '--pos-encoding',
        default=['peg'],
        nargs='+',
        choices=CPVT.POS_ENCODINGS,
        help='pos_encoding of the target CPVT, one name or several that '
        "compose (e.g. learnable rope-mixed); the table is kept only with "
        "'learnable'")
    parser.add_argument(
        '--use-cls-token',
        action='store_true',
        help='keep the class token (target use_cls_token=True)')
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if len(args.pos_encoding) == 1:
        args.pos_encoding = args.pos_encoding[0]
    state_dict = timm_vit_to_cpvt(
        load_timm_state_dict(args.src),
        pos_encoding=args.pos_encoding,
        use_cls_token=args.use_cls_token)
    if osp.dirname(args.dst):
        os.makedirs(osp.dirname(args.dst), exist_ok=True)
    meta = dict(
        source=osp.basename(args.src),
        pos_encoding=args.pos_encoding,
        use_cls_token=args.use_cls_token)
    torch.save(dict(state_dict=state_dict, meta=meta), args.dst)
    num_blocks = len({k.split('.')[1] for k in state_dict
                      if k.startswith('blocks.')})
    print(f'Saved {len(state_dict)} tensors ({num_blocks} blocks, '
          f"embed_dims {state_dict['patch_embed.weight'].shape[0]}) to "
          f'{args.dst}')


if __name__ == '__main__':
    main()
