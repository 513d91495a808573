"""The tables of the compile report (``kernel_report.py``), from its JSON
alone (standard library only: ``docs_tables.py`` writes them into
docs/benchmark.md from docs/data/kernel_report_sm90.json)."""
from typing import List

KERNELS = ('forward', 'backward_kv', 'backward_q')
DTYPES = ('bfloat16', 'float32')


def setting_table(rows: List[dict]) -> str:
    """One row per setting: registers, spill bytes (ptxas), shared memory,
    ptxas C7515 notes, and per tile (a 64 x 64 tile per warp of four) the
    instructions, tensor-core instructions, LDG, global atomics and memory
    fences of each kernel (forward / backward-kv / backward-q), the total
    and its ratio to the same kernels without a term."""
    out = ['| heads | setting | registers | spill bytes | shared KB | C7515 '
           '| per tile | total | x no term | tensor core | LDG | atomics | '
           'fences |', '|' + '---|' * 2 + '---:|' * 11]
    for r in rows:
        ks = [r['kernels'][k] for k in KERNELS]
        ratio = '-' if r['x_no_term'] is None else f"{r['x_no_term']:.2f}"

        def each(get):
            return ' / '.join(str(get(k)) for k in ks)

        out.append(
            f"| {r['heads']} | {r['setting']} | "
            f"{each(lambda k: k['registers'])} | "
            f"{each(lambda k: k['spill_stores'])} | "
            f"{each(lambda k: k['shared'] // 1024)} | "
            f"{sum(k['c7515'] for k in ks)} | "
            f"{each(lambda k: k['per_tile']['instructions'])} | "
            f"{r['per_tile']} | {ratio} | "
            f"{each(lambda k: k['per_tile']['tensor_core'])} | "
            f"{each(lambda k: k['per_tile']['global_loads'])} | "
            f"{each(lambda k: k['per_tile']['global_atomics'])} | "
            f"{each(lambda k: k['per_tile']['fences'])} |")
    return '\n'.join(out)


def aims_table(aims: List[dict]) -> str:
    """The compiled aims (bfloat16, sm_90): value and met / not met."""
    out = ['| heads | setting | aim | value | met |', '|---|---|---|---:|---|']
    out += [f"| {a['heads']} | {a['setting']} | {a['aim']} | {a['value']} | "
            f"{'yes' if a['met'] else 'no'} |" for a in aims]
    return '\n'.join(out)


def markdown(report: dict) -> str:
    """The whole report: one table per dtype, then the aims."""
    v, src = report['versions'], report['source']
    lines = [f"Compiled for sm_{report['arch']} by Triton {v['triton']} / "
             f"{v['ptxas']}, no GPU ({src['command']}, "
             f"{src['date']}); per tile: the SASS instructions of the "
             'loop bodies for a 64 x 64 tile per warp of four (forward / '
             'backward-kv / backward-q).', '']
    for dtype in DTYPES:
        rows = [r for r in report['rows'] if r['dtype'] == dtype]
        if rows:
            lines += [f'**{dtype}**', '', setting_table(rows), '']
    if report['aims']:
        lines += [aims_table(report['aims']), '']
    return '\n'.join(lines)
