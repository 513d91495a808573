"""One run of the proxy ablation (``ablation.py``): ``tools/train.py`` in a
subprocess with a row's options and seed (its wall time and peak resident
memory measured), then the tests the study asks for
(``tools/analysis/eval_resolutions.py``, ``tools/test.py``); the metrics
read back from the runs' logs."""
import glob
import json
import os
import os.path as osp
from typing import Dict, List

from ablation_process import run_script, run_script_measured
from ablation_studies import RES_TESTS, SEG_TESTS, STUDY_DATA, VAL_EVERY


def _val_records(work_dir: str) -> List[dict]:
    """The validation records (``coco/bbox_mAP`` lines) of a run's
    ``scalars.json`` files, in the order of its (resumed) run directories."""
    records = []
    for path in sorted(
            glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))):
        with open(path) as f:
            records += [rec for rec in map(json.loads, f)
                        if 'coco/bbox_mAP' in rec]
    return records


def _last_val_metrics(work_dir: str) -> Dict[str, float]:
    records = _val_records(work_dir)
    metrics = records[-1] if records else {}
    if not metrics:
        raise RuntimeError(f'no validation metrics in {work_dir}')
    return {k: v for k, v in metrics.items() if k.startswith('coco/')}


def _val_curve(work_dir: str) -> Dict[str, list]:
    """Every validation of a run, by epoch: ``epochs``, ``bbox_mAP``,
    ``bbox_mAP_50`` (a resumed run's later directory wins an epoch logged
    twice)."""
    by_epoch = {int(rec['step']): rec for rec in _val_records(work_dir)}
    epochs = sorted(by_epoch)
    return dict(epochs=epochs, **{
        key: [by_epoch[e][f'coco/{key}'] for e in epochs]
        for key in ('bbox_mAP', 'bbox_mAP_50')
    })


def _res_arguments(study: str) -> List[str]:
    """eval_resolutions.py's ``--scales`` / ``--canvas`` for a study."""
    out = []
    for kind, flag in (('resize', '--scales'), ('canvas', '--canvas')):
        factors = [str(f) for k, f in RES_TESTS[study] if k == kind]
        out += [flag, *factors] if factors else []
    return out


def run_one(study: str, name: str, config: str, options: List[str],
            seed: int, args) -> dict:
    """Train one row with one seed (and test it at other sizes for the
    studies of :data:`RES_TESTS`)."""
    slug = name.replace(' ', '_').replace('#', '').replace('+', 'p')
    work_dir = osp.join(args.work_dir, study, f'{slug}_seed{seed}')
    os.makedirs(work_dir, exist_ok=True)
    val_every = VAL_EVERY.get(study, args.epochs)
    opts = [
        f'randomness.seed={seed}', f'train_cfg.max_epochs={args.epochs}',
        f'train_cfg.val_interval={val_every}',
        'default_hooks.checkpoint.max_keep_ckpts=1',
        f'default_hooks.checkpoint.interval={args.epochs}', *options
    ]
    if args.data_root:
        root = args.data_root.rstrip('/') + '/'
        opts += [
            f'train_dataloader.dataset.data_root={root}',
            f'val_dataloader.dataset.data_root={root}',
            f'test_dataloader.dataset.data_root={root}',
            f'val_evaluator.ann_file={root}annotations/instances_val.json',
            f'test_evaluator.ann_file={root}annotations/instances_val.json'
        ]
    result = dict(study=study, row=name, seed=seed, config=config,
                  options=options)
    threads = getattr(args, 'threads', None)
    resume = ['--resume'] if glob.glob(osp.join(work_dir, '*.pth')) else []
    result['train_seconds'], peak_mb = run_script_measured(
        ['tools/train.py', config, '--work-dir', work_dir, *resume,
         '--cfg-options', *opts], osp.join(work_dir, 'train.log'), threads)
    if study == 'vitdet_layout':
        result['train_peak_mb'] = peak_mb
    result['metrics'] = _last_val_metrics(work_dir)
    if study in VAL_EVERY:
        result['val_curve'] = _val_curve(work_dir)
    if study in RES_TESTS:
        ckpt = osp.join(work_dir, f'epoch_{args.epochs}.pth')
        run_script([
            'tools/analysis/eval_resolutions.py', config, ckpt,
            *_res_arguments(study), '--work-dir',
            osp.join(work_dir, 'res'), '--cfg-options', *opts
        ], osp.join(work_dir, 'eval_resolutions.log'), threads)
        with open(osp.join(work_dir, 'res', 'eval_resolutions.json')) as f:
            result['scales'] = json.load(f)['results']
    return result


def _last_metrics(work_dir: str, pattern: str, key: str) -> Dict[str, float]:
    """The last JSON line with ``key`` in the files matching ``pattern``."""
    metrics: Dict[str, float] = {}
    for path in sorted(glob.glob(osp.join(work_dir, pattern))):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if key in rec:
                    metrics = rec
    if not metrics:
        raise RuntimeError(f'no {key} in {work_dir}/{pattern}')
    return metrics


def run_seg_one(study: str, name: str, config: str, options: List[str],
                seed: int, args) -> dict:
    """Train one segmentation row for ``args.epochs`` *iterations*, then
    test its checkpoint in every :data:`SEG_TESTS` setting (mIoU)."""
    slug = name.replace(' ', '_').replace('(', '').replace(')', '')
    work_dir = osp.join(args.work_dir, study, f'{slug}_seed{seed}')
    os.makedirs(work_dir, exist_ok=True)
    iters = args.epochs
    data_root = args.data_root or STUDY_DATA.get(study, (None, ))[0]
    opts = [
        f'randomness.seed={seed}', f'train_cfg.max_iters={iters}',
        f'train_cfg.val_interval={iters}',
        f'default_hooks.checkpoint.interval={iters}',
        f'param_scheduler.1.end={iters}', *options
    ]
    if data_root:
        root = data_root.rstrip('/') + '/'
        opts += [f'{split}_dataloader.dataset.data_root={root}'
                 for split in ('train', 'val', 'test')]
    result = dict(study=study, row=name, seed=seed, config=config,
                  options=options)
    threads = getattr(args, 'threads', None)
    resume = ['--resume'] if glob.glob(osp.join(work_dir, '*.pth')) else []
    result['train_seconds'] = run_script(
        ['tools/train.py', config, '--work-dir', work_dir, *resume,
         '--cfg-options', *opts], osp.join(work_dir, 'train.log'), threads)
    result['metrics'] = _last_metrics(work_dir, '*/vis_data/scalars.json',
                                      'mIoU')
    ckpt = osp.join(work_dir, f'iter_{iters}.pth')
    result['tests'] = {}
    for test, test_opts in SEG_TESTS.items():
        if test_opts is None:
            result['tests'][test] = result['metrics']['mIoU']
            continue
        test_dir = osp.join(work_dir, f'test_{test}')
        run_script(['tools/test.py', config, ckpt, '--work-dir', test_dir,
              '--cfg-options', *opts, *test_opts],
             osp.join(work_dir, f'test_{test}.log'), threads)
        result['tests'][test] = _last_metrics(
            test_dir, '*/[0-9]*.json', 'mIoU')['mIoU']
    return result
