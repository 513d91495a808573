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
  RoPE-Mixed, RoPE-Mixed without sine, and sine + each offset bias
  (Swin-V2's log-CPB, 2D ALiBi, LookHere) in the encoder (the decoder's
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
    python tools/experiments/ablation.py --jobs 2 --markdown docs/data/ablation.md
    python tools/experiments/ablation.py --studies irpe_tab6 --seeds 0 1 2
    python tools/experiments/ablation.py --quick      # small, for a first look

Rows whose command is identical (Tab. 1 'ctx product' and Tab. 6 #6) are
run once and reported in both tables.

The study is not tuned toward the papers' answers: every row uses the same
schedule and data, and the numbers are what they are.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import List, Optional, Sequence

from ablation_report import summarise
from ablation_process import ROOT
from ablation_runs import run_one, run_seg_one
from ablation_studies import (DEFAULT_EPOCHS, DETR, RES_TESTS, SEG_STUDIES,
                              STUDIES, STUDY_DATA, run_key, trained_runs)


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
    commands = set(trained_runs(results))
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
                key = run_key(study, config, options, seed, epochs)
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
    time), as ``tools/analysis/eval_resolutions.py --canvas`` would: the
    canvas twins (:func:`~mmpe.datasets.synthetic_canvas.canvas_twin`) of
    the embedded set the runs test on.
    """
    factors = sorted({f for study in studies for kind, f in
                      RES_TESTS.get(study, []) if kind == 'canvas'})
    if not factors:
        return
    from mmengine.config import Config

    from mmpe.datasets.synthetic_canvas import canvas_twin
    cfg = Config.fromfile(osp.join(ROOT, DETR))
    # relative roots are the runs' (their working directory is ROOT)
    root = args.data_root or cfg.test_dataloader.dataset.data_root
    for factor in factors:
        try:
            out = canvas_twin(osp.join(ROOT, root), factor)
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
    trained = trained_runs(results)
    for study, name, config, options, seed, epochs in copies:
        same = trained.get(run_key(study, config, options, seed, epochs))
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
