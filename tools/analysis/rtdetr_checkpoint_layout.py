"""Record the key layout of the RT-DETR authors' checkpoints as the fixture
``tests/data/rtdetr_authors/checkpoint_layout.json`` (for the converter's
tests: ``tests/test_tools/test_rtdetrv2_converter.py``).

Builds the authors' RT-DETRv2 (lyuwenyu/RT-DETR ``rtdetrv2_pytorch``:
``src/zoo/rtdetr/rtdetr.py`` ``RTDETR`` of ``PResNet``,
``HybridEncoder`` and ``RTDETRTransformerv2``, loaded by file: their
package's ``__init__`` imports its whole zoo and torchvision, which does not
load beside a CPU torch; these files need only ``register`` of ``src/core``,
a no-op here, and torchvision's ``box_area``, given here) with the settings
of the released R18vd 120e and R50vd 6x configs (``eval_spatial_size``
640 x 640, as the released YAML), and records its state dict's names,
shapes and dtypes, which parameters train (their optimiser's), the
top-level keys of a checkpoint of their solver
(``src/solver/_solver.py`` ``state_dict``: every attribute that has a
``state_dict``) and of their ``ModelEMA.state_dict``. No weights and no code
of theirs are stored: the tests make weights by a rule from the shapes.

Usage::

    git clone https://github.com/lyuwenyu/RT-DETR /tmp/RT-DETR
    python tools/analysis/rtdetr_checkpoint_layout.py /tmp/RT-DETR
"""
import argparse
import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys
import types

import torch

PACKAGE = 'rtdetr_layout_src'
OUT = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))),
               'tests', 'data', 'rtdetr_authors', 'checkpoint_layout.json')
#: the released configs' arguments (configs/rtdetrv2/include/
#: rtdetrv2_r50vd.yml, rtdetrv2_r18vd_120e_coco.yml)
SETTINGS = {
    'r18': dict(
        backbone=dict(depth=18, variant='d', return_idx=[1, 2, 3],
                      num_stages=4, freeze_at=-1, freeze_norm=False),
        encoder=dict(in_channels=[128, 256, 512], hidden_dim=256,
                     expansion=0.5),
        decoder=dict(num_layers=3)),
    'r50': dict(
        backbone=dict(depth=50, variant='d', return_idx=[1, 2, 3],
                      num_stages=4, freeze_at=0, freeze_norm=True),
        encoder=dict(in_channels=[512, 1024, 2048], hidden_dim=256,
                     expansion=1.0),
        decoder=dict(num_layers=6)),
}
COMMON_DECODER = dict(
    feat_channels=[256, 256, 256], feat_strides=[8, 16, 32], hidden_dim=256,
    num_levels=3, num_queries=300, num_denoising=100, label_noise_ratio=0.5,
    box_noise_scale=1.0, eval_idx=-1, num_points=[4, 4, 4],
    cross_attn_method='default', query_select_method='default',
    eval_spatial_size=[640, 640])
#: the files loaded, as modules of a stand-in package
FILES = ('nn/backbone/common.py', 'nn/backbone/presnet.py',
         'zoo/rtdetr/utils.py', 'zoo/rtdetr/box_ops.py',
         'zoo/rtdetr/denoising.py', 'zoo/rtdetr/hybrid_encoder.py',
         'zoo/rtdetr/rtdetrv2_decoder.py', 'zoo/rtdetr/rtdetr.py')


def _package(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []
    sys.modules[name] = module
    return module


def load_released(src: str) -> dict:
    """The released modules by file, under :data:`PACKAGE`."""
    for name in ('', '.nn', '.nn.backbone', '.zoo', '.zoo.rtdetr'):
        _package(PACKAGE + name)
    core = _package(PACKAGE + '.core')
    core.register = lambda *args, **kwargs: (lambda cls: cls)
    # torchvision's box_area (torchvision/ops/boxes.py): the one name used
    vision = _package('torchvision')
    ops = _package('torchvision.ops')
    boxes = types.ModuleType('torchvision.ops.boxes')
    boxes.box_area = lambda b: (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    sys.modules['torchvision.ops.boxes'] = boxes
    vision.ops, ops.boxes = ops, boxes
    modules = {}
    for path in FILES:
        name = PACKAGE + '.' + path[:-3].replace('/', '.')
        spec = importlib.util.spec_from_file_location(name,
                                                      osp.join(src, path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        modules[osp.basename(path)[:-3]] = module
    return modules


def build(modules: dict, setting: dict) -> torch.nn.Module:
    decoder = dict(COMMON_DECODER, **setting['decoder'])
    return modules['rtdetr'].RTDETR(
        backbone=modules['presnet'].PResNet(**setting['backbone']),
        encoder=modules['hybrid_encoder'].HybridEncoder(
            eval_spatial_size=[640, 640], **setting['encoder']),
        decoder=modules['rtdetrv2_decoder'].RTDETRTransformerv2(**decoder))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('checkout', help='a clone of lyuwenyu/RT-DETR')
    parser.add_argument('--out', default=OUT)
    args = parser.parse_args()
    src = osp.join(args.checkout, 'rtdetrv2_pytorch', 'src')
    commit = subprocess.run(['git', '-C', args.checkout, 'rev-parse', 'HEAD'],
                            capture_output=True, text=True).stdout.strip()
    modules = load_released(src)
    record = dict(
        source=f'lyuwenyu/RT-DETR {commit} rtdetrv2_pytorch',
        command='python tools/analysis/rtdetr_checkpoint_layout.py '
        '<RT-DETR checkout>',
        # _solver.py state_dict(): 'date', 'last_epoch' and every attribute
        # with a state_dict (after _setup and train())
        solver_keys=['date', 'last_epoch', 'model', 'criterion',
                     'postprocessor', 'ema', 'optimizer', 'lr_scheduler',
                     'lr_warmup_scheduler'],
        # ema.py ModelEMA.state_dict()
        ema_keys=['module', 'updates'],
        models={})
    for name, setting in SETTINGS.items():
        model = build(modules, setting)
        record['models'][name] = dict(
            setting=setting,
            state_dict=[[k, list(v.shape), str(v.dtype).replace('torch.', '')]
                        for k, v in model.state_dict().items()],
            # what their optimiser gets (get_optim_params: requires_grad)
            trainable=[k for k, v in model.named_parameters()
                       if v.requires_grad])
    os.makedirs(osp.dirname(args.out), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(record, f, indent=0)
        f.write('\n')
    print(f'wrote {args.out}: ' + ', '.join(
        f"{k} {len(v['state_dict'])} keys"
        for k, v in record['models'].items()))


if __name__ == '__main__':
    main()
