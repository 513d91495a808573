"""The data files ``make_figures.py`` writes into ``docs/data`` before it
draws from them: a ``make demo`` run's ``scalars.json``
(``demo_scalars.json``) and the validation curves of the ablation's
``decoder_rpb_*`` studies (``decoder_rpb.json``)."""
import glob
import importlib.util
import json
import os.path as osp
from typing import Optional

from figures_computed import DEMO_CONFIG, ROOT


def _study_rows(study: str) -> list:
    """The rows of an ablation study in their order, from
    ``tools/experiments/ablation_studies.py`` (self-contained: loaded from
    its file, as this folder's scripts do not import another folder's)."""
    path = osp.join(ROOT, 'tools', 'experiments', 'ablation_studies.py')
    spec = importlib.util.spec_from_file_location('_ablation_studies', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.STUDIES[study]


def record_demo_scalars(demo_work_dir: Optional[str], data_dir: str,
                        note: Optional[str]) -> None:
    """Copy the demo run's scalars.json into ``data_dir/demo_scalars.json``
    with where it came from."""
    if not demo_work_dir:
        return
    runs = sorted(
        glob.glob(osp.join(demo_work_dir, '*', 'vis_data', 'scalars.json')))
    if not runs:
        print(f'[make_figures] no scalars.json under {demo_work_dir}')
        return
    path = osp.join(data_dir, 'demo_scalars.json')
    run_names = [osp.relpath(p, demo_work_dir) for p in runs]
    if note is None and osp.isfile(path):
        # the same run drawn again: keep what was said about how it was run
        with open(path) as f:
            old = json.load(f)['source']
        if old.get('runs') == run_names:
            note = old.get('note')
    records = []
    for path_ in runs:  # a resumed run continues in a new timestamped dir
        with open(path_) as f:
            records += [json.loads(line) for line in f if line.strip()]
    data = dict(
        what='MMEngine scalars.json of a make demo run: training losses '
        'at every logging interval (step = iteration) and validation COCO '
        'metrics (step = epoch).',
        source=dict(
            config=DEMO_CONFIG,
            runs=run_names,
            command=f'python tools/train.py {DEMO_CONFIG} --work-dir '
            f'{demo_work_dir} --resume (the make demo step)',
            note=note or ''),
        records=records)
    with open(path, 'w') as f:
        json.dump(data, f, indent=1)
        f.write('\n')
    print(f'[make_figures] wrote {path} ({len(records)} records)')


#: the ablation studies of the decoder's bias, in the figure's panel order
DECODER_RPB_STUDIES = ('decoder_rpb_dab', 'decoder_rpb_cond')
DECODER_RPB_TITLES = {'decoder_rpb_dab': 'DAB-DETR (BoxRPB)',
                      'decoder_rpb_cond': 'Conditional DETR (point-RPB)'}


def record_decoder_rpb(runs_json: Optional[str], data_dir: str,
                       note: Optional[str]) -> None:
    """Write ``data_dir/decoder_rpb.json`` from the JSON of
    ``tools/experiments/ablation.py`` (``--out``) with the
    ``decoder_rpb_*`` studies: every run's validation AP50 by epoch
    (``val_curve``), rows in the study's order, each with the seeds it was
    run with (``seed_ids``, ascending)."""
    if not runs_json:
        return
    with open(runs_json) as f:
        runs = json.load(f)
    panels = []
    for study in DECODER_RPB_STUDIES:
        mine = [r for r in runs if r['study'] == study and 'val_curve' in r]
        if not mine:
            continue
        names = [name for name, _, _ in _study_rows(study)
                 if any(r['row'] == name for r in mine)]
        by_row = {name: {r['seed']: r for r in mine if r['row'] == name}
                  for name in names}
        epochs = sorted({tuple(r['val_curve']['epochs']) for r in mine})
        if len(epochs) != 1:
            raise ValueError(f'{study}: runs validated at different epochs '
                             f'{epochs}; give one schedule per study')
        rows = []
        for name in names:
            seeds = sorted(by_row[name])
            rows.append(dict(
                name=name, bias='RPB' in name, seed_ids=seeds,
                seeds=[by_row[name][s]['val_curve']['bbox_mAP_50']
                       for s in seeds]))
        panels.append(dict(
            title=f'{DECODER_RPB_TITLES[study]}, {epochs[0][-1]} epochs',
            study=study, epochs=list(epochs[0]), rows=rows))
    data = dict(
        what='Validation bbox AP50 (COCO, 100 validation images of the '
        'embedded data set) at every epoch of the decoder_rpb studies of '
        'tools/experiments/ablation.py: DAB-DETR and Conditional DETR with '
        'and without the relative position bias in the decoder '
        '(decoder_pe), with and without contextual iRPE in the encoder; '
        'one list per seed (seed_ids).',
        # the note's keys (date, machine, the runs' command) win
        source={
            'published': 'docs/results.md#relative-position-in-the-decoder-'
            'boxrpb-decoder_rpb_dab-decoder_rpb_cond',
            'command': 'python tools/analysis/make_figures.py --only '
            f'decoder_rpb --decoder-rpb-runs {runs_json}',
            **(json.loads(note) if note else {})},
        metric='bbox_mAP_50', panels=panels)
    path = osp.join(data_dir, 'decoder_rpb.json')
    with open(path, 'w') as f:
        json.dump(data, f, indent=1)
        f.write('\n')
    print(f'[make_figures] wrote {path} ({len(panels)} panels)')
