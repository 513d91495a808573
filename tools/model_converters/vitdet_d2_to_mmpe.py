"""Convert a detectron2 ViTDet checkpoint (ViT + simple feature pyramid) to
mmpe's CPVT + ViTSimpleFPN weights.

Example (ViTDet's COCO Mask R-CNN, ViT-B)::

    wget https://dl.fbaipublicfiles.com/detectron2/ViTDet/COCO/mask_rcnn_vitdet_b/f325346929/model_final_61ccd1.pkl
    python tools/model_converters/vitdet_d2_to_mmpe.py \\
        model_final_61ccd1.pkl checkpoints/vitdet-b_d2-coco_mmpe.pth

The output holds ``backbone.*`` and ``neck.*`` keys (load them with
``init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.')``
in the backbone and ``prefix='neck.'`` in the neck, or ``load_from``);
detectron2's RPN / ROI heads are not converted. The printed backbone and
neck configs select ``window_padding='zeros'`` and
``pos_embed_interp='detectron2'``: without them the backbone computes other
features than detectron2 (see docs/user_guides/vitdet.md).
"""
import argparse
import os
import os.path as osp
import pickle
import pprint
from typing import Dict

import numpy as np
import torch

from mmpe.models.utils.vitdet_detectron2 import (infer_vitdet_config,
                                                 vitdet_d2_to_mmpe)

# what a detectron2 model-zoo .pkl may hold: numpy arrays in dicts
_PKL_GLOBALS = {
    ('numpy.core.multiarray', '_reconstruct'), ('numpy', 'ndarray'),
    ('numpy', 'dtype'), ('numpy.core.multiarray', 'scalar'),
    ('numpy._core.multiarray', '_reconstruct'),
    ('numpy._core.multiarray', 'scalar'), ('collections', 'OrderedDict')
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and dicts only: a weights file never needs
    code to run when it is read."""

    def find_class(self, module: str, name: str):
        if (module, name) in _PKL_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f'{module}.{name} in a .pkl checkpoint: only numpy arrays in '
            'dicts are read (detectron2 model-zoo files); save the weights '
            'with torch.save instead')


def load_d2_state_dict(path: str) -> Dict[str, torch.Tensor]:
    """detectron2's ``model`` weights from a model-zoo ``.pkl`` (numpy
    arrays) or a ``.pth`` written by its checkpointer (tensors)."""
    if path.endswith('.pkl'):
        with open(path, 'rb') as f:
            ckpt = _ArrayUnpickler(f, encoding='latin1').load()
    else:
        # weights_only: a tensor-only file never needs code execution
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    if isinstance(ckpt, dict) and isinstance(ckpt.get('model'), dict):
        ckpt = ckpt['model']
    if not isinstance(ckpt, dict):
        raise ValueError(f'{path}: expected a dict of weights (or one under '
                         f"'model'), got {type(ckpt).__name__}")
    return {
        k: torch.from_numpy(np.ascontiguousarray(v))
        if isinstance(v, np.ndarray) else v
        for k, v in ckpt.items()
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Convert a detectron2 ViTDet checkpoint (backbone and '
        'simple feature pyramid) to mmpe CPVT + ViTSimpleFPN weights')
    parser.add_argument('src', help='detectron2 checkpoint (.pkl / .pth)')
    parser.add_argument('dst', help='output .pth')
    parser.add_argument(
        '--num-heads', type=int, default=None,
        help='attention heads (read from the relative tables when present)')
    parser.add_argument(
        '--window-size', type=int, default=None,
        help='window size S of the window blocks, 0 for global attention '
        'in every block (read from the relative tables where their sizes '
        'tell it; required where every block has tables of one size)')
    parser.add_argument(
        '--global-blocks', type=int, nargs='*', default=None,
        help='indices of the blocks of global attention, e.g. 2 5 8 11 '
        "(ViT-B); read from the relative tables where their sizes tell it")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    state_dict = load_d2_state_dict(args.src)
    config = infer_vitdet_config(
        state_dict,
        num_heads=args.num_heads,
        window_size=args.window_size,
        global_blocks=args.global_blocks)
    converted, config, report = vitdet_d2_to_mmpe(state_dict, config)
    if osp.dirname(args.dst):
        os.makedirs(osp.dirname(args.dst), exist_ok=True)
    meta = dict(source=osp.basename(args.src), config=config)
    torch.save(dict(state_dict=converted, meta=meta), args.dst)
    print(f'Saved {len(converted)} tensors (backbone and neck) to '
          f'{args.dst}; not converted: {len(report["dropped"])} keys of '
          "detectron2's detection heads (proposal_generator.*, "
          'roi_heads.*).')
    print("The backbone computes detectron2's features only with "
          "window_padding='zeros' and pos_embed_interp='detectron2' (set "
          'below). Config:')
    print('backbone = ' + pprint.pformat(config['backbone'], sort_dicts=False))
    if config['neck'] is not None:
        print('neck = ' + pprint.pformat(config['neck'], sort_dicts=False))


if __name__ == '__main__':
    main()
