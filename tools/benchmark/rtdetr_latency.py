"""CPU latency of RT-DETR per AIFI encoding: the whole model and AIFI's
encoder alone, at 640 x 640 and 1280 x 1280.

For each encoding of ``--encodings`` (``model.neck.encoder_pe``: the
authors' sin-cos ``sine``, and the sin-cos plus ``irpe``, ``rope2d``,
``rope-mixed``, ``log-cpb``, ``alibi-2d``, ``lookhere``, as the encoding
configs of configs/rtdetr/ set them) and each size of ``--sizes``, the
config's model (``--config``, default the R50vd 6x recipe; no pre-trained
weights, random ones: time does not depend on them) in evaluation mode:

* ``model``: one inference of a batch of ``--batch`` images, what
  ``tools/test.py`` runs per batch: the data preprocessor, backbone, hybrid
  encoder, decoder and post-processing (``mode='predict'``);
* ``aifi``: the hybrid encoder's AIFI layer alone on the stride-32 map of
  that size (``neck.aifi``: the encoding's tables made for the grid, the
  transformer layer).

Each row runs ``--warmup`` then ``--repeats`` times under
``torch.inference_mode``, rows taking turns (round-robin) so that load
changes hit all of them; the median is reported with the ratio to the
``sine`` row of the same size and part. Nothing is timed in a test; run it
on a machine as quiet as you can get (the load average is recorded)::

    python tools/benchmark/rtdetr_latency.py --threads 1 \\
        --out work_dirs/rtdetr_latency.json
    python tools/benchmark/rtdetr_latency.py --quick   # to try the script
"""
import argparse
import copy
import os
import statistics
import sys
import time
from typing import Dict, List

import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs
from mmdet.utils import register_all_modules
from mmengine.config import Config

from mmpe.utils.bench_env import benchmark_device, benchmark_env, finish_env
from mmpe.utils.benchmark_helpers import write_json

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
CONFIG = os.path.join(ROOT, 'configs', 'rtdetr', 'rtdetrv2_r50vd_6x_coco.py')
QUICK_CONFIG = os.path.join(ROOT, 'configs', 'quickstart',
                            'rtdetr_r18vd_synthetic.py')
#: the relative part of each row's encoder_pe (the authors' sin-cos always)
ENCODINGS = {
    'sine': None,
    'irpe': dict(type='irpe', mode='contextual', method='product',
                 ratio=1.9, shared_head=True, on='k'),
    'rope2d': dict(type='rope2d'),
    'rope-mixed': dict(type='rope-mixed', coords='normalized'),
    'log-cpb': dict(type='log-cpb', pretrained_size=(25, 25), hidden=512),
    'alibi-2d': 'alibi-2d',
    'lookhere': dict(type='lookhere', directions='corners'),
}
BASELINE = 'sine'


def build_model(config: str, encoding: str) -> torch.nn.Module:
    cfg = Config.fromfile(config)
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.backbone.init_cfg = None
    model_cfg.neck.encoder_pe = dict(absolute='sine',
                                     relative=ENCODINGS[encoding])
    torch.manual_seed(0)
    model = MODELS.build(model_cfg)
    model.init_weights()
    return model.eval()


def model_call(model, batch: int, size: int):
    packed = demo_mm_inputs(batch, [(3, size, size)] * batch,
                            num_items=[1] * batch, num_classes=2)

    def run():
        data = model.data_preprocessor(packed, False)
        model(**data, mode='predict')

    return run


def aifi_call(model, batch: int, size: int):
    """AIFI alone on the stride-32 grid of ``size``."""
    neck = model.neck
    channels = neck.hidden_dim
    grid = -(-size // 32)
    feats = torch.randn(batch, channels, grid, grid)

    def run():
        neck.aifi(0, feats)

    return run


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--config', default=CONFIG)
    parser.add_argument('--encodings', nargs='+', default=list(ENCODINGS),
                        choices=list(ENCODINGS))
    parser.add_argument('--sizes', nargs='+', type=int, default=[640, 1280])
    parser.add_argument('--parts', nargs='+', default=['model', 'aifi'],
                        choices=['model', 'aifi'])
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument('--quick', action='store_true',
                        help='the quick-start model at 64 and 128 px, one '
                        'repeat: to try the script')
    parser.add_argument('--out', default=None, help='JSON of the rows')
    args = parser.parse_args(argv)
    if args.quick:
        args.config, args.sizes = QUICK_CONFIG, [64, 128]
        args.warmup, args.repeats = 0, 1
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    register_all_modules()
    device = benchmark_device('cpu', args.threads)
    env = benchmark_env(device, config=os.path.relpath(args.config, ROOT),
                        batch=args.batch)
    calls: Dict[str, object] = {}
    for encoding in args.encodings:
        model = build_model(args.config, encoding)
        for size in args.sizes:
            for part in args.parts:
                make = model_call if part == 'model' else aifi_call
                calls[f'{part} {size} {encoding}'] = make(
                    model, args.batch, size)
    times: Dict[str, List[float]] = {name: [] for name in calls}
    with torch.inference_mode():
        for round_ in range(args.warmup + args.repeats):
            for name, run in calls.items():
                start = time.perf_counter()
                run()
                if round_ >= args.warmup:
                    times[name].append(time.perf_counter() - start)
    rows = []
    for name, values in times.items():
        part, size, encoding = name.split(' ')
        median = statistics.median(values)
        base = statistics.median(times[f'{part} {size} {BASELINE}']) \
            if f'{part} {size} {BASELINE}' in times else None
        rows.append(dict(part=part, size=int(size), encoding=encoding,
                         median_ms=1000 * median,
                         x_sine=median / base if base else None))
    print(f'{"part":6} {"size":>5} {"encoding":12} {"ms":>10} {"x sine":>7}')
    for row in rows:
        ratio = f'{row["x_sine"]:.2f}' if row['x_sine'] else '-'
        print(f'{row["part"]:6} {row["size"]:5d} {row["encoding"]:12} '
              f'{row["median_ms"]:10.1f} {ratio:>7}')
    if args.out:
        write_json(args.out, dict(env=finish_env(env), rows=rows,
                                  command=" ".join(sys.argv)))


if __name__ == '__main__':
    main()
