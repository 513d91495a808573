"""What the foundation-ViT converters (``dinov2_to_mmpe.py``,
``dinov3_to_mmpe.py``) share: reading the authors' file, the refusal of
another model's file (one line, exit status 2, nothing written), saving
and printing the backbone config."""
import argparse
import os
import os.path as osp
import pprint
import sys
from typing import Callable, Dict, Tuple

import torch

from mmpe.models.utils.checkpoint_keys import CheckpointMismatch


def load_state_dict(path: str) -> Dict[str, torch.Tensor]:
    """The weights of a ``.pth`` (a plain state dict, or one under
    ``'model'`` / ``'state_dict'``); tensors only (``weights_only``)."""
    ckpt = torch.load(path, map_location='cpu', weights_only=True)
    for key in ('model', 'state_dict'):
        if isinstance(ckpt, dict) and isinstance(ckpt.get(key), dict):
            ckpt = ckpt[key]
    if not isinstance(ckpt, dict):
        raise CheckpointMismatch(
            f'expected a dict of weights, got {type(ckpt).__name__}')
    return ckpt


def base_parser(description: str) -> argparse.ArgumentParser:
    """``src``, ``dst`` and ``--drop-prefix-tokens``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('src', help="the authors' state dict (.pth)")
    parser.add_argument('dst', help='output .pth')
    parser.add_argument(
        '--drop-prefix-tokens', action='store_true',
        help='drop the class token, the registers and the class row of a '
        'position table (for window blocks, which have no place for them)')
    return parser


def convert_file(args: argparse.Namespace,
                 convert: Callable[[Dict[str, torch.Tensor]],
                                   Tuple[dict, dict]]) -> None:
    """Read ``args.src``, ``convert`` it, save ``args.dst`` with the config
    in its meta and print the config; a :class:`CheckpointMismatch` is one
    line on stderr and exit status 2, nothing written."""
    try:
        converted, config = convert(load_state_dict(args.src))
    except CheckpointMismatch as err:
        print(f'{args.src}: {err}', file=sys.stderr)
        sys.exit(2)
    if osp.dirname(args.dst):
        os.makedirs(osp.dirname(args.dst), exist_ok=True)
    meta = dict(source=osp.basename(args.src), config=config)
    torch.save(dict(state_dict=converted, meta=meta), args.dst)
    print(f'Saved {len(converted)} tensors to {args.dst}. Backbone config:')
    print('backbone = ' + pprint.pformat(config, sort_dicts=False))
