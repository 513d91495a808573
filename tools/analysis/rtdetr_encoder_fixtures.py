"""Record the released RT-DETR backbone and hybrid encoder's outputs as the
parity fixtures of ``tests/data/rtdetr_authors/`` (``r18.json``,
``r50.json``).

Runs the authors' ``rtdetrv2_pytorch`` (lyuwenyu/RT-DETR: ``PResNet`` of
``src/nn/backbone/presnet.py``, ``HybridEncoder`` of
``src/zoo/rtdetr/hybrid_encoder.py``, loaded by file: their package's
``__init__`` imports its whole zoo and torchvision, which do not load
beside a CPU torch; these four files need only ``register`` of
``src/core``, given here as a no-op) with the settings of the released
RT-DETRv2 R18vd and R50vd configs, every weight and BN statistic set by
the rule of ``rtdetr_weight_rule.py`` from its name and shape, in eval
mode, at 640 x 640 (``eval_spatial_size=[640, 640]``, their eval path) and
480 x 800 (``eval_spatial_size=None``: their code builds the sin-cos for
the grid of the call). Each file keeps the seed, the stored input image,
the released state dict's names and shapes, and per size the sampled
values and checksums of every backbone and encoder level. No code of
theirs is stored.

Usage::

    git clone https://github.com/lyuwenyu/RT-DETR /tmp/RT-DETR
    python tools/analysis/rtdetr_encoder_fixtures.py /tmp/RT-DETR
"""
import argparse
import datetime
import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys
import types

import torch
from rtdetr_weight_rule import (SEED, level_record, rule_image, rule_state,
                                small_image)

PACKAGE = 'rtdetr_released'
#: the released configs' backbone / encoder arguments
#: (configs/rtdetrv2/rtdetrv2_r18vd_120e_coco.yml, include/rtdetrv2_r50vd.yml)
SETTINGS = {
    'r18': dict(
        backbone=dict(depth=18, variant='d', return_idx=[1, 2, 3],
                      num_stages=4, freeze_at=-1, freeze_norm=False),
        encoder=dict(in_channels=[128, 256, 512], hidden_dim=256,
                     expansion=0.5)),
    'r50': dict(
        backbone=dict(depth=50, variant='d', return_idx=[1, 2, 3],
                      num_stages=4, freeze_at=0, freeze_norm=True),
        encoder=dict(in_channels=[512, 1024, 2048], hidden_dim=256,
                     expansion=1.0)),
}
#: input (H, W) -> the released ``eval_spatial_size``
SIZES = {'640x640': ((640, 640), [640, 640]), '480x800': ((480, 800), None)}


def find_src(path: str) -> str:
    """The ``rtdetrv2_pytorch/src`` folder of a checkout (or of that
    folder itself)."""
    for src in (osp.join(path, 'rtdetrv2_pytorch', 'src'),
                osp.join(path, 'src')):
        if osp.isfile(osp.join(src, 'zoo', 'rtdetr', 'hybrid_encoder.py')):
            return src
    raise SystemExit(f'{path}: no rtdetrv2_pytorch/src/zoo/rtdetr/'
                     'hybrid_encoder.py here; pass a checkout of '
                     'lyuwenyu/RT-DETR')


def load_released(src: str):
    """``(PResNet, HybridEncoder)`` of the released files, loaded as
    modules of a stand-in package."""
    for name in ('', '.nn', '.nn.backbone', '.zoo', '.zoo.rtdetr'):
        package = types.ModuleType(PACKAGE + name)
        package.__path__ = []
        sys.modules[PACKAGE + name] = package
    core = types.ModuleType(PACKAGE + '.core')
    core.register = lambda *args, **kwargs: (lambda obj: obj)
    sys.modules[PACKAGE + '.core'] = core

    def load(relative: str):
        name = PACKAGE + '.' + relative[:-3].replace('/', '.')
        spec = importlib.util.spec_from_file_location(
            name, osp.join(src, relative))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    load('nn/backbone/common.py')
    presnet = load('nn/backbone/presnet.py')
    load('zoo/rtdetr/utils.py')
    hybrid = load('zoo/rtdetr/hybrid_encoder.py')
    return presnet.PResNet, hybrid.HybridEncoder


def keys_of(module: torch.nn.Module):
    return [[k, list(v.shape)] for k, v in module.state_dict().items()]


def record(presnet_cls, encoder_cls, setting: dict, image: torch.Tensor):
    """The fixture of one setting: names, shapes, outputs per size."""
    out = dict(sizes={})
    for size_name, (size, eval_size) in SIZES.items():
        backbone = presnet_cls(**setting['backbone'], pretrained=False)
        encoder = encoder_cls(
            **setting['encoder'], eval_spatial_size=eval_size)
        out['backbone_keys'] = keys_of(backbone)
        out['encoder_keys'] = keys_of(encoder)
        backbone.load_state_dict(rule_state(out['backbone_keys']))
        encoder.load_state_dict(rule_state(out['encoder_keys']))
        backbone.eval()
        encoder.eval()
        with torch.no_grad():
            feats = backbone(rule_image(image, size))
            outs = encoder(feats)
        out['sizes'][size_name] = dict(
            input_size=list(size),
            eval_spatial_size=eval_size,
            backbone=[level_record(f) for f in feats],
            encoder=[level_record(f) for f in outs])
        scales = [round(f.std().item(), 3) for f in (*feats, *outs)]
        print(f'  {size_name}: level std {scales}')
    return out


def commit_of(path: str) -> str:
    try:
        return subprocess.run(['git', '-C', path, 'rev-parse', 'HEAD'],
                              capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('authors', help='checkout of lyuwenyu/RT-DETR')
    parser.add_argument(
        '--out', default=osp.join('tests', 'data', 'rtdetr_authors'),
        help='output folder (default: %(default)s)')
    args = parser.parse_args()
    presnet_cls, encoder_cls = load_released(find_src(args.authors))
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    image = small_image(SEED)
    for name, setting in SETTINGS.items():
        print(name)
        data = dict(
            seed=SEED,
            source=dict(
                repo='lyuwenyu/RT-DETR', commit=commit_of(args.authors),
                files=['rtdetrv2_pytorch/src/nn/backbone/presnet.py',
                       'rtdetrv2_pytorch/src/zoo/rtdetr/hybrid_encoder.py'],
                torch=torch.__version__,
                date=datetime.date.today().isoformat(),
                command='python tools/analysis/rtdetr_encoder_fixtures.py '
                        '<RT-DETR checkout>'),
            setting=setting,
            image=image.tolist(),
            **record(presnet_cls, encoder_cls, setting, image))
        path = osp.join(args.out, f'{name}.json')
        with open(path, 'w') as f:
            json.dump(data, f, separators=(',', ':'))
        print(f'  wrote {path} ({osp.getsize(path) // 1024} KiB)')


if __name__ == '__main__':
    main()
