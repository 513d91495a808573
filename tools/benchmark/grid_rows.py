"""Gather rows of ``attention.py --out`` runs into one data file of docs/data.

Each input is one run's JSON (one or more grids); the output keeps, per row
name matching ``--variants``, the fwd+bwd median time (ms) and the tensor
peak (MiB) at every grid of the inputs, with the date, machine and command
of each run in ``sources`` (the form of ``docs/data/attention_grids.json``,
which ``tools/analysis/docs_tables.py`` reads)::

    python tools/benchmark/grid_rows.py \\
        work_dirs/bench/broadcast_25x42.json \\
        work_dirs/bench/broadcast_50x84.json \\
        --what 'One DETR encoder self-attention layer ...' \\
        --command-of 25x42='python tools/benchmark/attention.py ...' \\
        --out docs/data/attention_broadcast_terms.json

Only the standard library: numbers are copied (rounded), never recomputed.
"""
import argparse
import json
import re
from typing import Dict, List, Optional


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('inputs', nargs='+', help='attention.py --out files')
    parser.add_argument('--out', required=True, help='the data file')
    parser.add_argument('--what', required=True,
                        help='what the rows measure (the file\'s "what")')
    parser.add_argument('--variants', default=None,
                        help='regex: only rows whose name matches')
    parser.add_argument('--command-of', nargs='+', default=[],
                        metavar='GRID=COMMAND',
                        help='the command of the run of each grid')
    parser.add_argument('--machine', default='',
                        help='the machine and its load, for every source')
    return parser.parse_args(argv)


def gather(runs: List[dict], pattern: Optional[str]) -> dict:
    """``{'grids': [...], 'tokens': [...], 'rows': [...], 'env': {...}}``
    of the runs, grids in input order, a row's values None where a grid's
    run lacks it."""
    grids, tokens, envs = [], [], {}
    by_name: Dict[str, Dict[str, dict]] = {}
    for run in runs:
        for grid, res in run['grids'].items():
            h, w = (int(v) for v in grid.split('x'))
            grids.append(grid)
            tokens.append(h * w)
            envs[grid] = run['env']
            for rec in res['layer']:
                if pattern and not re.search(pattern, rec['name']):
                    continue
                by_name.setdefault(rec['name'], {})[grid] = rec
    rows = []
    for name, recs in by_name.items():
        row = dict(name=name, fwd_bwd_ms=[], peak_mb=[])
        for grid in grids:
            rec = recs.get(grid, {})
            ms = rec.get('fwd_bwd_ms')
            peak = rec.get('fwd_bwd_peak_mb')
            row['fwd_bwd_ms'].append(None if ms is None else round(ms, 1))
            row['peak_mb'].append(None if peak is None else round(peak))
        rows.append(row)
    return dict(grids=grids, tokens=tokens, rows=rows, env=envs)


def main(argv: Optional[List[str]] = None) -> dict:
    args = parse_args(argv)
    runs = []
    for path in args.inputs:
        with open(path) as f:
            runs.append(json.load(f))
    data = gather(runs, args.variants)
    commands = dict(item.split('=', 1) for item in args.command_of)
    sources = {}
    for grid in data['grids']:
        env = data['env'][grid]
        load = [env.get(f'load_avg_{when}') for when in ('start', 'end')]
        machine = args.machine
        if all(load):
            machine += (f'; {env.get("threads")} thread(s), load average '
                        f'{load[0][0]:.1f} at the start, {load[1][0]:.1f} at '
                        'the end')
        sources[grid] = dict(date=env.get('date', ''), machine=machine,
                             command=commands.get(grid, ''))
    out = dict(what=args.what, sources=sources, grids=data['grids'],
               tokens=data['tokens'], rows=data['rows'])
    with open(args.out, 'w') as f:
        json.dump(out, f, indent=1)
        f.write('\n')
    print(f'wrote {args.out}: {len(data["rows"])} rows')
    return out


if __name__ == '__main__':
    main()
