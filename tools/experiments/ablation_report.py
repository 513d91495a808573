"""The tables of the proxy ablation (``ablation.py --markdown``): one
Markdown table per study, mean ± sample standard deviation over seeds."""
import math
from typing import List, Tuple

from ablation_studies import (RES_TESTS, SEG_STUDIES, SEG_TESTS, STUDIES,
                              VAL_EVERY)


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
