"""Proxy ablation study on the embedded data set, with seeds and error bars.

COCO-scale training is impossible on a 2-core CPU, so this re-creates the
*shape* of the papers' tables with the quick-start models:

- ``irpe_tab6``: iRPE paper Tab. 6 rows on the quick-start DETR (no PE /
  sine / sine + bias / contextual without abs PE / sine + contextual clip /
  sine + contextual piecewise);
- ``irpe_tab1``: Tab. 1's undirected (euclidean, quant) vs directed (cross,
  product) methods, contextual on keys, with the sine encoding;
- ``cpvt_res``: CPVT's resolution generalisation: the tiny CPVT Mask R-CNN
  with 'peg' / 'learnable' / 'sine' / 'rope2d' (and 'none' as the control),
  trained at one size and evaluated at 1x, 1.5x and 2x without fine-tuning;
  plus 'peg' with the batch padding masked in the backbone;
- ``cpvt_seg``: CPVT's size claim in semantic segmentation: the quick-start
  Semantic FPN with a tiny CPVT ('peg', 'learnable' (resampled), 'sine',
  'none', 'rope-mixed', 'irpe') and mmseg's Twins-PCPVT at about its size,
  trained on 128 x 128 crops (the number given to ``--epochs`` is
  *iterations* for this study), tested whole-image at 1x, 1.5x and 2x and
  with a 128 x 128 sliding window (mIoU, mmseg's IoUMetric);
- ``cpvt_seg_shape``: the same rows and tests on the embedded set drawn with
  ``--object-hue random`` (any hue for any class, so a model must recognise
  the shape, which takes the layout of several patches: position
  information); the study makes that set in ``data/synthetic_seg_shape``
  (or checks the one given by ``--data-root``);
- ``vitdet_layout``: ViTDet's window + global layout against global
  attention in every block, for each position encoding of the plain ViT:
  the quick-start twin of the ViTDet configs (tiny CPVT Mask R-CNN, 4 x 4
  windows in blocks 0 and 2, padding-aware) with 'none' / 'peg' /
  'learnable' / 'irpe' / 'rope-mixed' / 'rel-pos' (ViTDet's decomposed
  relative position: window blocks' tables for 4 x 4, global blocks' for
  the 16 x 16 grid of the config's ``img_size``, resized to each input),
  and the same with ``window_size=0``; box and mask AP at 1x and 2x test size, training time
  and the training process's peak memory (RSS, the largest of it and its
  data workers);
- ``encoder_pe_detr`` / ``encoder_pe_cond``: which position encoding a
  DETR-family encoder should use (``encoder_pe``): the quick-start DETR and
  Conditional DETR with sine, sine + contextual iRPE, sine + RoPE-2D, sine +
  RoPE-Mixed and RoPE-Mixed without sine in the encoder (the decoder's
  cross-attention keys keep the sine encoding in every row). Conditional
  DETR's step costs about twice DETR's, so it trains for half the epochs:
  each run gets about the same wall time;
- ``rope_coords_detr`` / ``rope_coords_cond``: which RoPE coordinates keep
  the rotary lead at larger test sizes: DETR and Conditional DETR with
  sine, sine + RoPE-Mixed on integer token indices, on DINOv3's normalised
  coordinates, on normalised coordinates with DINOv3's training
  augmentations (rescale 2, jitter 1.2), sine + contextual iRPE piecewise
  and clip; every run tested at 1x, 1.5x and 2x resized and on the 2x
  canvas (the embedded test set drawn twice as large per side at the same
  object sizes: longer sequences without larger objects), AP and AP50;
- ``decoder_rpb_dab`` / ``decoder_rpb_cond``: relative position in the
  decoder's cross-attention (Plain-DETR's box-to-pixel relative position
  bias, ``decoder_pe``): DAB-DETR with sine, sine + BoxRPB, sine + iRPE ctx
  in the encoder, sine + iRPE ctx + BoxRPB; Conditional DETR the same with
  the point variant (point-RPB). Validated at every epoch (the AP and AP50
  of every validation are kept in the JSON, ``val_curve``: the curve by
  epoch) and tested at 1x and 2x resized.

Every run is ``tools/train.py`` (and ``tools/analysis/eval_resolutions.py``
for the studies of :data:`RES_TESTS`) in a subprocess; the final validation metrics are read from
the run's ``scalars.json``. The table (mean +- sample std over seeds, wall
time) goes to stdout, to ``--out`` (JSON) and, with ``--markdown``, to a
Markdown file::

    # all three studies, two runs at a time on a 2-core machine (~2.5 h)
    python tools/experiments/ablation.py --jobs 2 --markdown docs/ablation.md
    python tools/experiments/ablation.py --studies irpe_tab6 --seeds 0 1 2
    python tools/experiments/ablation.py --quick      # small, for a first look

Rows whose command is identical (Tab. 1 'ctx product' and Tab. 6 #6) are
run once and reported in both tables.

The study is not tuned toward the papers' answers: every row uses the same
schedule and data, and the numbers are what they are.
"""
import argparse
import glob
import json
import math
import os
import os.path as osp
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
DETR = 'configs/quickstart/detr_r18_synthetic.py'
DETR_IRPE = 'configs/quickstart/detr_irpe_r18_synthetic.py'
CPVT = 'configs/quickstart/mask-rcnn_cpvt-tiny_synthetic.py'
CPVT_PADMASK = 'configs/quickstart/mask-rcnn_cpvt-tiny_padmask_synthetic.py'
RPE = 'model.encoder.layer_cfg.self_attn_cfg.rpe_cfg'
DETR_ROPE2D = 'configs/quickstart/detr_rope2d_r18_synthetic.py'
DETR_ROPE_MIXED = 'configs/quickstart/detr_rope-mixed_r18_synthetic.py'
COND_IRPE = 'configs/quickstart/conditional-detr_irpe_r18_synthetic.py'
COND_ROPE_MIXED = \
    'configs/quickstart/conditional-detr_rope-mixed_r18_synthetic.py'
DAB_IRPE = 'configs/quickstart/dab-detr_irpe_r18_synthetic.py'
DAB_BOX_RPB = 'configs/quickstart/dab-detr_box-rpb_r18_synthetic.py'
DAB_IRPE_BOX_RPB = 'configs/quickstart/dab-detr_irpe_box-rpb_r18_synthetic.py'
COND_POINT_RPB = \
    'configs/quickstart/conditional-detr_point-rpb_r18_synthetic.py'
COND_IRPE_POINT_RPB = \
    'configs/quickstart/conditional-detr_irpe_point-rpb_r18_synthetic.py'
NO_SINE = 'model.encoder_pe.absolute=none'
ROPE = 'model.encoder_pe.relative'
NORMALIZED = [f'{ROPE}.coords=normalized']
#: DINOv3's released setting (rescale 2) and a mild per-axis jitter
AUGMENTED = NORMALIZED + [f'{ROPE}.rescale=2.0', f'{ROPE}.jitter=1.2']
CLIP = ['index=clip', 'max_distance=3']  # the iRPE paper's Tab. 6 #5
VITDET = 'configs/quickstart/mask-rcnn_vit-tiny-peg_vitdet_synthetic.py'
CPVT_SEG = 'configs/quickstart/fpn_cpvt-tiny_synthetic-seg.py'
PCPVT_SEG = 'configs/quickstart/fpn_pcpvt-tiny_synthetic-seg.py'
SEG_STUDIES = ('cpvt_seg', 'cpvt_seg_shape')
#: studies on their own variant of the embedded set: study -> (default data
#: root, arguments of tools/dataset_converters/make_synthetic_seg.py)
STUDY_DATA = {
    'cpvt_seg_shape': ('data/synthetic_seg_shape', ['--object-hue', 'random'])
}
#: test of the segmentation studies -> extra --cfg-options of tools/test.py
#: (None: the run's final validation, which is that test at x1)
SEG_TESTS = {
    'x1': None,
    **{f'x{s:g}': [f'test_dataloader.dataset.pipeline.1.scale_factor={s}']
       for s in (1.5, 2.0)},
    'slide': ['model.test_cfg.mode=slide',
              'model.test_cfg.crop_size=(128,128)',
              'model.test_cfg.stride=(85,85)'],
}

SEG_ROWS = [
    (f'CPVT {pe}', CPVT_SEG, [f'model.backbone.pos_encoding={pe}'])
    for pe in ('peg', 'learnable', 'sine', 'none', 'rope-mixed', 'irpe')
] + [('Twins-PCPVT (mmseg)', PCPVT_SEG, [])]

#: study -> list of (row name, config, extra --cfg-options)
STUDIES: Dict[str, List[tuple]] = {
    'irpe_tab6': [
        ('#2 no PE', DETR_IRPE,
         ['model.positional_encoding=None', f'{RPE}=None']),
        ('#1 sine (DETR)', DETR, []),
        ('#3 sine + bias', DETR_IRPE, [f'{RPE}.mode=bias']),
        ('#4 ctx, no abs PE', DETR_IRPE, ['model.positional_encoding=None']),
        ('#5 sine + ctx clip', DETR_IRPE,
         [f'{RPE}.index=clip', f'{RPE}.max_distance=3']),
        ('#6 sine + ctx piecewise', DETR_IRPE, []),
    ],
    # 'product' is the config's own method: that row is the same run as
    # Tab. 6 #6 (identical config and options), so it is reused, not re-run
    'irpe_tab1': [
        (f'ctx {m}', DETR_IRPE,
         [f'{RPE}.method={m}'] if m != 'product' else [])
        for m in ('euclidean', 'quant', 'cross', 'product')
    ],
    'cpvt_res': [(f'CPVT {pe}', CPVT, [f'model.backbone.pos_encoding={pe}'])
                 for pe in ('peg', 'learnable', 'sine', 'rope2d', 'none')] + [
        # the same 'peg' model when the backbone is told the batch padding
        ('CPVT peg + padding mask', CPVT_PADMASK,
         ['model.backbone.pos_encoding=peg'])
    ],
    # the windowed twin as configured, and with global attention everywhere
    'vitdet_layout': [
        (f'{layout} {pe}', VITDET,
         [f'model.backbone.pos_encoding={pe}'] +
         (['model.backbone.window_size=0'] if layout == 'global' else []))
        for layout in ('global', 'windowed')
        for pe in ('none', 'peg', 'learnable', 'irpe', 'rope-mixed',
                   'rel-pos')
    ],
    'cpvt_seg': SEG_ROWS,
    'cpvt_seg_shape': SEG_ROWS,  # only the data differ (STUDY_DATA)
    # 'sine' and 'sine + iRPE ctx' are Tab. 6 #1 and #6 (the same commands)
    'encoder_pe_detr': [
        ('DETR sine', DETR, []),
        ('DETR sine + iRPE ctx', DETR_IRPE, []),
        ('DETR sine + RoPE-2D', DETR_ROPE2D, []),
        ('DETR sine + RoPE-Mixed', DETR_ROPE_MIXED, []),
        ('DETR RoPE-Mixed, no sine', DETR_ROPE_MIXED, [NO_SINE]),
    ],
    'encoder_pe_cond': [
        ('Cond. DETR sine', COND_ROPE_MIXED,
         ['model.encoder_pe.relative=None']),
        ('Cond. DETR sine + iRPE ctx', COND_IRPE, []),
        ('Cond. DETR sine + RoPE-2D', COND_ROPE_MIXED,
         ['model.encoder_pe.relative=rope2d']),
        ('Cond. DETR sine + RoPE-Mixed', COND_ROPE_MIXED, []),
        ('Cond. DETR RoPE-Mixed, no sine', COND_ROPE_MIXED, [NO_SINE]),
    ],
}
# the rows of the RoPE-coordinate studies: (name, DETR config and options,
# Conditional DETR config and options); Conditional DETR's 'sine' row is
# its RoPE config without the relative part, and its iRPE is in encoder_pe
ROPE_COORD_ROWS = [
    ('sine', DETR, [], COND_ROPE_MIXED, [f'{ROPE}=None']),
    ('sine + RoPE-Mixed index', DETR_ROPE_MIXED, [], COND_ROPE_MIXED, []),
    ('sine + RoPE-Mixed normalized', DETR_ROPE_MIXED, NORMALIZED,
     COND_ROPE_MIXED, NORMALIZED),
    ('sine + RoPE-Mixed normalized, rescale 2, jitter 1.2', DETR_ROPE_MIXED,
     AUGMENTED, COND_ROPE_MIXED, AUGMENTED),
    ('sine + iRPE piecewise', DETR_IRPE, [], COND_IRPE, []),
    ('sine + iRPE clip', DETR_IRPE, [f'{RPE}.{o}' for o in CLIP], COND_IRPE,
     [f'{ROPE}.{o}' for o in CLIP]),
]
STUDIES['rope_coords_detr'] = [(f'DETR {name}', config, opts)
                               for name, config, opts, _, _ in ROPE_COORD_ROWS]
STUDIES['rope_coords_cond'] = [(f'Cond. DETR {name}', config, opts)
                               for name, _, _, config, opts in ROPE_COORD_ROWS]
# with and without the decoder's bias, with and without encoder iRPE; the
# 'sine' rows are the iRPE configs without the encoder's relative part
# (the bias configs' encoder-only twins, as the bias-only configs are theirs)
STUDIES['decoder_rpb_dab'] = [
    ('DAB-DETR sine', DAB_IRPE, [f'{ROPE}=None']),
    ('DAB-DETR sine + BoxRPB', DAB_BOX_RPB, []),
    ('DAB-DETR sine + iRPE ctx', DAB_IRPE, []),
    ('DAB-DETR sine + iRPE ctx + BoxRPB', DAB_IRPE_BOX_RPB, []),
]
STUDIES['decoder_rpb_cond'] = [
    ('Cond. DETR sine', COND_IRPE, [f'{ROPE}=None']),
    ('Cond. DETR sine + point-RPB', COND_POINT_RPB, []),
    ('Cond. DETR sine + iRPE ctx', COND_IRPE, []),
    ('Cond. DETR sine + iRPE ctx + point-RPB', COND_IRPE_POINT_RPB, []),
]
SCALES = (1.0, 1.5, 2.0)
#: studies tested at other sizes after training (tools/analysis/
#: eval_resolutions.py): study -> its tests, (kind, factor) with kind
#: 'resize' (the test pipeline's sizes times the factor) or 'canvas' (the
#: embedded test set drawn on a canvas that much larger, same objects)
RES_TESTS = {
    'cpvt_res': [('resize', s) for s in SCALES],
    'vitdet_layout': [('resize', 1.0), ('resize', 2.0)],
    **dict.fromkeys(('rope_coords_detr', 'rope_coords_cond'),
                    [('resize', s) for s in SCALES] + [('canvas', 2.0)]),
    **dict.fromkeys(('decoder_rpb_dab', 'decoder_rpb_cond'),
                    [('resize', 1.0), ('resize', 2.0)]),
}
#: studies validated every that many epochs (the others: at the end only);
#: every validation's AP and AP50 go to the run's ``val_curve``
VAL_EVERY = {'decoder_rpb_dab': 1, 'decoder_rpb_cond': 1}
#: epochs per run of each study, as reported in docs/results.md (what 2 CPU
#: cores allow for 3 seeds of every row in a few hours, not a full schedule)
DEFAULT_EPOCHS = {
    'irpe_tab6': 8,
    'irpe_tab1': 8,
    'cpvt_res': 4,
    'vitdet_layout': 4,  # the quick-start schedule
    'encoder_pe_detr': 8,
    'encoder_pe_cond': 4,  # ~ the wall time of DETR's 8 (step 0.72 / 0.41 s)
    'cpvt_seg': 150,  # iterations (of 8 crops): what 2 busy cores allowed
    'cpvt_seg_shape': 1500,  # iterations: the demo's schedule
    'rope_coords_detr': 8,  # the encoder_pe studies' schedules
    'rope_coords_cond': 4,
    # what 2 shared cores allowed in 100 minutes for 3 seeds of the rows
    # without encoder iRPE and 1 of those with (docs/results.md)
    'decoder_rpb_dab': 3,
    'decoder_rpb_cond': 3,
}


def _run(cmd: Sequence[str], log_file: str,
         threads: Optional[int] = None) -> float:
    """Seconds of ``python cmd`` (see :func:`_run_measured`)."""
    return _run_measured(cmd, log_file, threads)[0]


def _run_measured(cmd: Sequence[str], log_file: str,
                  threads: Optional[int] = None) -> Tuple[float, float]:
    """Run ``python cmd`` from the repository root, output to ``log_file``.

    Returns:
        tuple[float, float]: Wall seconds and the peak resident memory in
        MB of that process (the largest of it and the children it waited
        for, e.g. data workers), from the kernel's accounting of this one
        child (``os.wait4``), so runs side by side are told apart. Linux
        keeps the high-water mark of the launching process image from
        before ``exec``, so this script's own size (tens of MB: it imports
        no torch) is a floor of the number.
    """
    env = dict(os.environ)
    if threads:  # parallel runs must not oversubscribe the cores
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    start = time.time()
    with open(log_file, 'w') as log:
        proc = subprocess.Popen(
            [sys.executable, *cmd],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f'{" ".join(cmd)} failed; see {log_file}')
    return seconds, usage.ru_maxrss / 1024  # Linux: ru_maxrss in KiB


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


def _res_label(kind: str, factor: float) -> str:
    return f'x{factor:g}' + (' canvas' if kind == 'canvas' else '')


def _res_metric(result: dict, kind: str, factor: float,
                key: str) -> float:
    """A metric of one resolution test of a run (NaN when absent); runs
    recorded before the canvas test have no ``test`` key: resize."""
    for test in result.get('scales', []):
        if (test.get('test', 'resize'), test['scale']) == (kind, factor):
            return test['metrics'].get(key, float('nan'))
    return float('nan')


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
    result['train_seconds'], peak_mb = _run_measured(
        ['tools/train.py', config, '--work-dir', work_dir, *resume,
         '--cfg-options', *opts], osp.join(work_dir, 'train.log'), threads)
    if study == 'vitdet_layout':
        result['train_peak_mb'] = peak_mb
    result['metrics'] = _last_val_metrics(work_dir)
    if study in VAL_EVERY:
        result['val_curve'] = _val_curve(work_dir)
    if study in RES_TESTS:
        ckpt = osp.join(work_dir, f'epoch_{args.epochs}.pth')
        _run([
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
    result['train_seconds'] = _run(
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
        _run(['tools/test.py', config, ckpt, '--work-dir', test_dir,
              '--cfg-options', *opts, *test_opts],
             osp.join(work_dir, f'test_{test}.log'), threads)
        result['tests'][test] = _last_metrics(
            test_dir, '*/[0-9]*.json', 'mIoU')['mIoU']
    return result


def _command(study: str, config: str, options: Sequence[str], seed: int,
             epochs: Optional[int]) -> tuple:
    """What makes two runs the same run, whatever row they report (a
    study with its own data set never shares runs with another)."""
    data = STUDY_DATA[study][1] if study in STUDY_DATA else None
    # a run tested at other sizes is not the same as one that is not, nor
    # one validated during training (the validation loader draws from the
    # global generator) as one validated at the end only
    return (config, tuple(options), seed, epochs, str(data),
            str(RES_TESTS.get(study)), VAL_EVERY.get(study))


def _trained(results: List[dict]) -> Dict[tuple, dict]:
    """Finished runs (not copies) by their command."""
    return {
        _command(r['study'], r['config'], r['options'], r['seed'],
                 r.get('epochs')): r
        for r in results if 'same_run_as' not in r
    }


def _mean_std(values: List[float], fmt: str = '.3f') -> str:
    """Mean ± sample standard deviation (n - 1), or the mean of one."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return f'{mean:{fmt}}'
    std = math.sqrt(sum((v - mean)**2 for v in values) / (n - 1))
    return f'{mean:{fmt}} ± {std:{fmt}}'


def _row_label(name: str, group: List[dict]) -> str:
    same = {r['same_run_as'] for r in group if 'same_run_as' in r}
    return name + ''.join(f' (= {s})' for s in sorted(same))


def summarise(results: List[dict]) -> str:
    """Markdown tables, one per study (the studies of :data:`RES_TESTS`: AP
    and AP50 at each test, cpvt_res and vitdet_layout one table per task,
    bbox and segm, and the training peak memory where measured): mean ±
    sample std over seeds."""
    lines: List[str] = []
    for study in STUDIES:
        rows = [r for r in results if r['study'] == study]
        if not rows:
            continue
        # the study's own row order (the paper's), then any unknown rows
        order = [name for name, _, _ in STUDIES[study]]
        names = sorted(dict.fromkeys(r['row'] for r in rows),
                       key=lambda n: order.index(n) if n in order else len(
                           order))
        seeds = sorted({r['seed'] for r in rows})
        epochs = sorted({r.get('epochs') for r in rows}, key=str)
        title = f'### {study} (seeds {seeds}, epochs {epochs})'
        groups = [(name, [r for r in rows if r['row'] == name])
                  for name in names]
        if study in SEG_STUDIES:
            head = ['row'] + [f'mIoU {t}' for t in SEG_TESTS] + [
                'train s/run']
            lines += [title.replace('epochs', 'iterations'), '',
                      '| ' + ' | '.join(head) + ' |',
                      '|' + '---|' * len(head)]
            for name, group in groups:
                cells = [_mean_std([r['tests'][t] for r in group], '.1f')
                         for t in SEG_TESTS]
                secs = _mean_std([r['train_seconds'] for r in group], '.0f')
                lines.append('| ' + ' | '.join(
                    [_row_label(name, group), *cells, secs]) + ' |')
            lines.append('')
            continue
        if study not in RES_TESTS:
            lines += [title, '', '| row | AP | AP50 | train s/run |',
                      '|---|---|---|---|']
            for name, group in groups:
                cells = [
                    _mean_std([r['metrics'][f'coco/bbox_mAP{m}']
                               for r in group]) for m in ('', '_50')
                ]
                secs = _mean_std([r['train_seconds'] for r in group], '.0f')
                lines.append('| ' + ' | '.join(
                    [_row_label(name, group), *cells, secs]) + ' |')
            lines.append('')
            continue
        # AP then AP50 at every test; Mask R-CNN studies: bbox and segm
        kinds = ('bbox', 'segm') if study in ('cpvt_res',
                                              'vitdet_layout') else ('bbox', )
        tests = RES_TESTS[study]
        # peak memory where the study measured it (every run of the study)
        with_mem = all('train_peak_mb' in r for r in rows)
        for kind in kinds:
            head = ['row'] + [
                f'{kind} AP{m} {_res_label(*t)}' for m in ('', '50')
                for t in tests
            ] + ['train s/run'] + (['train peak MB'] if with_mem else [])
            name_suffix = f': {kind}' if len(kinds) > 1 else ''
            lines += [f'{title}{name_suffix}', '',
                      '| ' + ' | '.join(head) + ' |',
                      '|' + '---|' * len(head)]
            for name, group in groups:
                cells = [
                    _mean_std([
                        _res_metric(r, *t, f'coco/{kind}_mAP{m}')
                        for r in group
                    ]) for m in ('', '_50') for t in tests
                ]
                cells.append(
                    _mean_std([r['train_seconds'] for r in group], '.0f'))
                if with_mem:
                    cells.append(_mean_std(
                        [r['train_peak_mb'] for r in group], '.0f'))
                lines.append('| ' + ' | '.join(
                    [_row_label(name, group), *cells]) + ' |')
            lines.append('')
        if study in VAL_EVERY:
            lines += _curve_table(title, groups)
    return '\n'.join(lines)


def _curve_table(title: str, groups: List[Tuple[str, List[dict]]]
                 ) -> List[str]:
    """Validation AP50 by epoch (mean ± sample std over the seeds that
    reached the epoch), one row per study row."""
    epochs = sorted({e for _, group in groups for r in group
                     for e in r.get('val_curve', {}).get('epochs', [])})
    head = ['row'] + [f'AP50 ep {e}' for e in epochs]
    lines = [f'{title}: validation AP50 by epoch', '',
             '| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for name, group in groups:
        cells = []
        for epoch in epochs:
            values = [
                r['val_curve']['bbox_mAP_50'][
                    r['val_curve']['epochs'].index(epoch)] for r in group
                if epoch in r.get('val_curve', {}).get('epochs', [])
            ]
            cells.append(_mean_std(values) if values else '')
        lines.append('| ' + ' | '.join([_row_label(name, group), *cells]) +
                     ' |')
    return lines + ['']


def parse_args(argv: Optional[Sequence[str]] = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--studies', nargs='+', default=list(STUDIES), choices=list(STUDIES))
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    parser.add_argument(
        '--epochs', type=int, default=None,
        help=f'epochs per run (default {DEFAULT_EPOCHS}; --quick: 3)')
    parser.add_argument(
        '--quick', action='store_true',
        help='3 epochs per run: a first look, not the study')
    parser.add_argument('--rows', nargs='+', help='only rows whose name '
                        'contains one of these strings')
    parser.add_argument('--exclude-rows', nargs='+', default=[],
                        help='not the rows whose name contains one of '
                        'these strings')
    parser.add_argument(
        '--jobs', type=int, default=1,
        help='runs trained at the same time (each its own process)')
    parser.add_argument(
        '--threads', type=int, default=None,
        help='OMP/MKL threads per run (default: CPU cores // --jobs)')
    parser.add_argument('--data-root', help='data set (default: config\'s)')
    parser.add_argument('--work-dir', default='work_dirs/ablation')
    parser.add_argument('--out', default=None, help='JSON of all runs')
    parser.add_argument('--markdown', default=None,
                        help='write the tables to this Markdown file')
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f'--jobs must be >= 1, got {args.jobs}')
    if args.threads is not None and args.threads < 1:
        parser.error(f'--threads must be >= 1, got {args.threads}')
    return args


def _save(results: List[dict], out: str) -> None:
    """Write the JSON atomically: an interrupted study keeps its runs."""
    tmp = out + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, out)


def _plan(args, results: List[dict]):
    """Split the requested (study, row, seed) into runs to train and rows
    whose command equals another one's (reported twice, trained once)."""
    done = {(r['study'], r['row'], r['seed']) for r in results}
    commands = set(_trained(results))
    runs, copies = [], []
    for study in args.studies:
        epochs = args.epochs or (3 if args.quick else DEFAULT_EPOCHS[study])
        for name, config, options in STUDIES[study]:
            if args.rows and not any(s in name for s in args.rows):
                continue
            if any(s in name for s in args.exclude_rows):
                continue
            for seed in args.seeds:
                if (study, name, seed) in done:
                    continue
                item = (study, name, config, options, seed, epochs)
                key = _command(study, config, options, seed, epochs)
                if key in commands:
                    copies.append(item)
                else:
                    commands.add(key)
                    runs.append(item)
    return runs, copies


def make_study_data(study: str, args) -> None:
    """Make (or find) the data variant a study needs (:data:`STUDY_DATA`).

    Raises:
        SystemExit: When the data root holds a set made with other
            parameters (the generator's message names them).
    """
    default_root, gen_args = STUDY_DATA[study]
    root = args.data_root or default_root
    proc = subprocess.run(
        [sys.executable, 'tools/dataset_converters/make_synthetic_seg.py',
         '--out-dir', root, *gen_args],
        cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f'study {study} needs the embedded set made with '
                         f'{" ".join(gen_args)} in {root}: '
                         f'{proc.stderr.strip()}')
    print(f'[ablation] {study}: data in {root} '
          f'({" ".join(gen_args)})', flush=True)


def make_canvas_data(studies: Sequence[str], args) -> None:
    """Write (or find) the canvas test sets the studies' tests need, once
    before the runs (parallel evaluations must not write them at the same
    time): ``tools/analysis/eval_resolutions.py``'s own
    :func:`canvas_data`, on the embedded set the runs test on.
    """
    factors = sorted({f for study in studies for kind, f in
                      RES_TESTS.get(study, []) if kind == 'canvas'})
    if not factors:
        return
    import importlib.util

    from mmengine.config import Config
    spec = importlib.util.spec_from_file_location(
        '_eval_resolutions',
        osp.join(ROOT, 'tools', 'analysis', 'eval_resolutions.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    cfg = Config.fromfile(osp.join(ROOT, DETR))
    # relative roots are the runs' (their working directory is ROOT)
    root = args.data_root or tool.test_data_root(cfg)
    cfg.test_dataloader.dataset.data_root = osp.join(ROOT, root)
    for factor in factors:
        try:
            out = tool.canvas_data(cfg, factor)
        except (ValueError, FileExistsError) as err:
            raise SystemExit(f'the canvas test x{factor:g} needs its data: '
                             f'{err}')
        print(f'[ablation] canvas x{factor:g}: test set in {out}', flush=True)


def _start(study, name, config, options, seed, args) -> dict:
    print(f'[ablation] start {study} | {name} | seed {seed} | '
          f'{args.epochs} epochs', flush=True)
    if study in SEG_STUDIES:
        return run_seg_one(study, name, config, options, seed, args)
    return run_one(study, name, config, options, seed, args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    out = args.out or osp.join(args.work_dir, 'ablation.json')
    os.makedirs(args.work_dir, exist_ok=True)
    results: List[dict] = []
    if osp.isfile(out):  # keep finished runs: a study can be continued
        with open(out) as f:
            results = json.load(f)
    runs, copies = _plan(args, results)
    for study in sorted({run[0] for run in runs} & set(STUDY_DATA)):
        make_study_data(study, args)
    make_canvas_data(sorted({run[0] for run in runs}), args)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    print(f'[ablation] {len(runs)} runs to train, {args.jobs} at a time, '
          f'{threads} thread(s) each; {len(results)} already in {out}',
          flush=True)
    failed = []
    # Each run is its own tools/train.py process; the pool only schedules
    # them (independent experiments, not a distributed job).
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {}
        for study, name, config, options, seed, epochs in runs:
            run_args = argparse.Namespace(**vars(args))
            run_args.epochs = epochs
            run_args.threads = threads
            future = pool.submit(_start, study, name, config, options, seed,
                                 run_args)
            futures[future] = (study, name, seed, epochs)
        for future in as_completed(futures):
            study, name, seed, epochs = futures[future]
            try:
                result = future.result()
            except Exception as e:  # keep the others going; report at the end
                failed.append(f'{study} | {name} | seed {seed}: {e}')
                print(f'[ablation] FAILED {failed[-1]}', flush=True)
                continue
            result['epochs'] = epochs
            results.append(result)
            _save(results, out)
            print(f'[ablation] done {study} | {name} | seed {seed}: '
                  f'AP50 {result["metrics"].get("coco/bbox_mAP_50")} / '
                  f'mIoU {result["metrics"].get("mIoU")} in '
                  f'{result["train_seconds"]:.0f} s', flush=True)
    trained = _trained(results)
    for study, name, config, options, seed, epochs in copies:
        same = trained.get(_command(study, config, options, seed, epochs))
        if same is None:  # the run it repeats failed
            continue
        same_as = f'{same["study"]}: {same["row"]}'
        print(f'[ablation] {study} | {name} | seed {seed}: same run as '
              f'{same_as}', flush=True)
        results.append(dict(same, study=study, row=name, same_run_as=same_as))
        _save(results, out)
    table = summarise(results)
    print(table)
    if args.markdown:
        with open(args.markdown, 'w') as f:
            f.write(table)
    if failed:
        print('[ablation] failed runs (logs in their work dirs):\n  ' +
              '\n  '.join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
