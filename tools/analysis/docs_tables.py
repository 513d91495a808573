"""Write the tables of the documentation from the data files in docs/data/.

A table that the docs print from measured data sits between two marker
comments in its page::

    <!-- table: NAME -->

    | ... the table ... |

    <!-- end table -->

and this script computes the text between them from ``docs/data/*.json``
(each file names the date, machine and command of its numbers; the
compile report's tables come from ``kernel_tables.py`` beside it)::

    python tools/analysis/docs_tables.py            # rewrite the tables
    python tools/analysis/docs_tables.py --check    # exit 1 if one differs

``make docs-tables`` runs the first. ``--root`` points at another checkout
(the test runs ``--check`` on a copy whose data it changed). Only the
standard library: the numbers are formatted, never recomputed, except the
mean and sample standard deviation over seeds of per-seed values.
"""
import argparse
import json
import os.path as osp
import re
import statistics
import sys
from typing import Callable, Dict, List, Sequence

import kernel_tables  # beside this script: the compile report's tables

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
MARKER = re.compile(r'<!-- table: ([\w.-]+) -->\n(.*?)<!-- end table -->',
                    re.DOTALL)
HEADS = {'vit-s': ('ViT-S', '6 x 64'), 'detr': ('DETR', '8 x 32')}


def load(root: str, name: str) -> dict:
    with open(osp.join(root, 'docs', 'data', name)) as f:
        return json.load(f)


def table(header: Sequence[str], rows: List[Sequence[str]],
          align: Sequence[str] = ()) -> str:
    """A Markdown table; ``align`` per column: '' (left) or 'r' (right)."""
    rules = ['---:' if a == 'r' else '---' for a in align] or \
        ['---'] * len(header)
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join(rules) + '|']
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines)


def f2(v) -> str:
    return '-' if v is None else f'{v:.2f}'


def mean_std(values: Sequence[float], places: int = 3) -> str:
    if len(values) == 1:
        return f'{values[0]:.{places}f}'
    return (f'{statistics.mean(values):.{places}f} ± '
            f'{statistics.stdev(values):.{places}f}')


# --- docs/benchmark.md: long sequences (attention_long*.json) ---


def long_group(root: str, length: int, cfg: str) -> str:
    """One length and head size of the long-sequence run, every row."""
    data = load(root, 'attention_long.json')
    group = next(g for g in data['groups']
                 if g['length'] == length and g['cfg'] == cfg)
    rows = [[r['name'], f"{r['fwd_bwd_ms']:.0f}", f2(r['x']),
             f2(r['c_e']), f"{r['peak_mb']:.0f}", f2(r['peak_x']),
             f"{r['rss_mb']:.0f}", f2(r['rss_x']), f"{r['first_s']:.1f}",
             r['graph_breaks']] for r in group['rows']]
    return table(['row', 'fwd+bwd ms', 'x', 'c/e', 'peak MiB', 'x',
                  'RSS MiB', 'x', '1st s', 'breaks'], rows,
                 [''] + ['r'] * 9)


def _aim(aims: List[dict], length: int, cfg: str, what: str) -> dict:
    prefix = f'L={length} {cfg} {what}'
    return next(a for a in aims if a['aim'].startswith(prefix))


def long_aims(root: str) -> str:
    """The run's own aims (its JSON's ``aims``), both head sizes a row."""
    data = load(root, 'attention_long.json')
    rows = []
    for length in (1050, 4096, 8192):
        for what in ('time', 'peak memory'):
            found = [a for a in data['aims']
                     if a['aim'].startswith(f'L={length} vit-s {what}')]
            if not found:
                continue
            limit = found[0]['aim'].split('<= ')[1]
            pair = [_aim(data['aims'], length, c, what) for c in HEADS]
            cells = [f2(a['value']) for a in pair]
            status = 'met' if all(a['met'] for a in pair) else '**missed**'
            edge = [f'{HEADS[c][0]}: {a["value"]:.5f}'
                    for c, a in zip(HEADS, pair)
                    if f2(a['value']) == f'{float(limit[:-1]):.2f}']
            if edge:
                status += f" ({', '.join(edge)})"
            rows.append([f'L = {length}: {what} <= {limit}'] + cells +
                         [status])
    ratios = {c: [r['c_e'] for g in data['groups'] if g['cfg'] == c
                  for r in g['rows'] if r['mode'] == 'compiled'
                  and r['variant'] != 'mmpe no RPE'] for c in HEADS}
    every = ratios['vit-s'] + ratios['detr']
    below = sum(v < 1 for v in every)
    status = 'met' if below == len(every) else \
        f'**not met** ({below} of {len(every)} rows below 1)'
    rows.append(['compiled faster than eager, every iRPE row (c/e < 1)'] +
                [f'{min(v):.2f}-{max(v):.2f}' for v in ratios.values()] +
                [status])
    return table(['aim', 'ViT-S heads', 'DETR heads', ''], rows,
                 ['', 'r', 'r', ''])


def long_limit(root: str) -> str:
    """iRPE against fused attention without RPE, float32 and bf16 runs;
    a time aim is met only when wall and CPU time both are (the JSON's
    ``met``)."""
    rows = []
    for dtype, name in (('float32', 'attention_long_limit_f32.json'),
                        ('bf16', 'attention_long_limit_bf16.json')):
        data = load(root, name)
        for g in data['groups']:
            base, irpe = (next(r for r in g['rows'] if r['variant'] == v)
                          for v in ('mmpe no RPE', 'mmpe ctx product k'))
            time, memory = (_aim(data['aims'], g['length'], g['cfg'], w)
                            for w in ('time', 'peak memory'))
            rows.append([
                g['length'], HEADS[g['cfg']][0], dtype, f2(irpe['x']),
                f2(irpe['cpu_x']),
                f"{base['peak_mb']:.0f} / {irpe['peak_mb']:.0f}",
                f2(irpe['peak_x']), 'met' if time['met'] else 'missed',
                'met' if memory['met'] else 'missed'])
    return table(['L', 'heads', 'dtype', 'x', 'cpu x',
                  'peak MiB (no RPE / iRPE)', 'peak x', 'time aim',
                  'memory aim'], rows,
                 ['r', '', '', 'r', 'r', '', 'r', '', ''])


# --- docs/results.md ---


def demo_seeds(root: str) -> str:
    """``make demo`` with seeds 0, 1, 2: AP50 by epoch, the mean of the
    last."""
    curves = load(root, 'demo_curves.json')['make_demo_seeds']['bbox_mAP_50']
    rows = [[name.split()[-1], ' / '.join(f'{v:.3f}' for v in ap50),
             f'{ap50[-1]:.3f}'] for name, ap50 in curves.items()]
    final = [ap50[-1] for ap50 in curves.values()]
    rows.append(['mean ± std', '', f'**{mean_std(final)}**'])
    return table(['seed', 'AP50 by epoch', 'final AP50'], rows)


def scale_panel(root: str, name: str, panel: int, labels: Sequence[str],
                title: str = '') -> str:
    data = load(root, name)['panels'][panel]
    places = 3 if name.startswith('encoder') else 1
    rows = []
    for r in data['rows']:
        if 'seeds' in r:  # per-seed values: their mean and sample std
            cells = [mean_std([seed[i] for seed in r['seeds']], places)
                     for i in range(len(r['seeds'][0]))]
        else:
            cells = [f'{m:.{places}f} ± {s:.{places}f}'
                     for m, s in zip(r['mean'], r['std'])]
        rows.append([r['name']] + cells)
    return table([title or data['title']] + list(labels), rows)


def decoder_rpb_end(root: str, panel: int, title: str) -> str:
    """AP50 after the last epoch per row: mean ± std and per seed."""
    data = load(root, 'decoder_rpb.json')['panels'][panel]
    rows = []
    for r in data['rows']:
        last = [seed[-1] for seed in r['seeds']]
        rows.append([r['name'], ' '.join(str(s) for s in r['seed_ids']),
                     mean_std(last), ' / '.join(f'{v:.3f}' for v in last)])
    return table([title, 'seeds', 'AP50 x1', 'AP50 x1 per seed'], rows)


def decoder_rpb_epochs(root: str, panel: int, title: str) -> str:
    """AP50 after each epoch per row, mean ± std over the seeds."""
    data = load(root, 'decoder_rpb.json')['panels'][panel]
    rows = [[r['name']] + [mean_std([seed[i] for seed in r['seeds']])
                           for i in range(len(data['epochs']))]
            for r in data['rows']]
    return table([title] + [f'epoch {e}' for e in data['epochs']], rows)


# --- docs/testing.md ---


def ci_runs(root: str) -> str:
    """The fresh-clone ``make test`` runs: set-up and suite seconds."""
    def secs(values):
        return ', '.join(f'{v} s' for v in values)

    rows = [[r['date'], r['conditions'], secs(r['setup_s']),
             secs(r['suite_s']), r['result']]
            for r in load(root, 'ci_runs.json')['runs']]
    return table(['date', 'conditions', 'set-up', 'suite', 'result'], rows)


# --- docs/benchmark.md: terms shared by every query, fused vs explicit ---


def attention_broadcast(root: str) -> str:
    """Per row of ``attention_broadcast_terms.json``: fwd+bwd ms and tensor
    peak MiB at each grid."""
    data = load(root, 'attention_broadcast_terms.json')
    header = ['row'] + [f'{g} {what}' for g in data['grids']
                        for what in ('fwd+bwd ms', 'peak MiB')]
    rows = []
    for r in data['rows']:
        cells = [r['name']]
        for ms, mb in zip(r['fwd_bwd_ms'], r['peak_mb']):
            cells += ['-' if ms is None else f'{ms:.1f}',
                      '-' if mb is None else str(mb)]
        rows.append(cells)
    return table(header, rows, [''] + ['r'] * (len(header) - 1))


# --- docs/benchmark.md: the Triton kernels' compile report ---


def kernel_report_rows(root: str, dtype: str) -> str:
    rows = [r for r in load(root, 'kernel_report_sm90.json')['rows']
            if r['dtype'] == dtype]
    return kernel_tables.setting_table(rows)


SCALES = ['x1 (grid <= 16)', 'x1.5 (<= 24)', 'x2 (<= 32)']
MIOU = ['mIoU x1', 'mIoU x1.5', 'mIoU x2']
TABLES: Dict[str, Callable[[str], str]] = {
    **{f'attention-long-{n}-{c}': (lambda r, n=n, c=c: long_group(r, n, c))
       for n in (1050, 4096, 8192) for c in HEADS},
    'attention-long-aims': long_aims,
    'attention-long-limit': long_limit,
    'demo-seeds': demo_seeds,
    'encoder-pe-scales-detr':
    lambda r: scale_panel(r, 'encoder_pe_scales.json', 0, SCALES),
    'encoder-pe-scales-cond':
    lambda r: scale_panel(r, 'encoder_pe_scales.json', 1, SCALES),
    'seg-scales-colour':
    lambda r: scale_panel(r, 'seg_scales.json', 0, MIOU, 'row'),
    'seg-scales-shape':
    lambda r: scale_panel(r, 'seg_scales.json', 1, MIOU, 'row'),
    'decoder-rpb-dab':
    lambda r: decoder_rpb_end(r, 0, 'DAB-DETR, 3 epochs'),
    'decoder-rpb-cond':
    lambda r: decoder_rpb_end(r, 1, 'Conditional DETR, 3 epochs'),
    'decoder-rpb-dab-epochs': lambda r: decoder_rpb_epochs(
        r, 0, 'DAB-DETR, validation AP50 by epoch'),
    'decoder-rpb-cond-epochs': lambda r: decoder_rpb_epochs(
        r, 1, 'Conditional DETR, validation AP50 by epoch'),
    'ci-runs': ci_runs,
    'attention-broadcast': attention_broadcast,
    'kernel-report-sm90-bf16': lambda r: kernel_report_rows(r, 'bfloat16'),
    'kernel-report-sm90-aims': lambda r: kernel_tables.aims_table(
        load(r, 'kernel_report_sm90.json')['aims']),
}
PAGES = ('docs/benchmark.md', 'docs/results.md', 'docs/testing.md')


def rewrite(text: str, root: str, page: str) -> str:
    """``text`` with every marked table replaced by what the data gives."""

    def fill(match):
        name = match.group(1)
        if name not in TABLES:
            raise KeyError(f'{page}: table {name!r} is not one of '
                           f'{sorted(TABLES)}')
        return (f'<!-- table: {name} -->\n\n{TABLES[name](root)}\n\n'
                '<!-- end table -->')

    return MARKER.sub(fill, text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default=ROOT,
                        help='checkout whose docs/ to read (default: this)')
    parser.add_argument('--check', action='store_true',
                        help='write nothing; exit 1 if a table differs')
    args = parser.parse_args(argv)
    stale, seen = [], set()
    for page in PAGES:
        path = osp.join(args.root, page)
        with open(path) as f:
            text = f.read()
        seen.update(m.group(1) for m in MARKER.finditer(text))
        new = rewrite(text, args.root, page)
        if new == text:
            continue
        old_tables = dict((m.group(1), m.group(2))
                          for m in MARKER.finditer(text))
        for m in MARKER.finditer(new):
            if old_tables.get(m.group(1)) != m.group(2):
                stale.append(f'{page}: table {m.group(1)}')
        if not args.check:
            with open(path, 'w') as f:
                f.write(new)
    missing = sorted(set(TABLES) - seen)
    if missing:
        print(f'tables with no marker in {PAGES}: {missing}', file=sys.stderr)
        return 1
    for line in stale:
        print(('differs from its data: ' if args.check else 'rewrote: ') +
              line, file=sys.stderr if args.check else sys.stdout)
    return 1 if args.check and stale else 0


if __name__ == '__main__':
    sys.exit(main())
