"""Parts of ``tools/gpu_check.py`` (``make gpu-check``): one training call
of an attention core, the fused kernel against the explicit backend
(forward and backward), the aims' benchmark of the fused kernel
(``tools/benchmark/fused_cuda.py``), and the report's files: markdown and
JSON in the output folder, and their copy under ``docs/data/`` named after
the device."""
import json
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..'))
#: C5 grids of DETR's 150-epoch recipe (batches padded to their largest
#: image; two size buckets each side of 1024 tokens)
GRIDS = ((15, 20), (20, 27), (25, 34), (34, 34), (42, 25))
# float32 kernels that sum in another order (flex / Triton tiles, cuBLAS);
# no TF32
CUDA_ATOL = 1e-4
# bfloat16 (8 bits of mantissa) against float32 on the same rounded inputs,
# relative to each tensor's largest value (the kernel tests' LOW_TOL)
BF16_RTOL = 3e-2
#: the grid of the bfloat16 row of each setting
BF16_GRID = (20, 27)
#: settings of the fused kernel's check: name -> PEAttention arguments
FUSED_SETTINGS = {
    'contextual product k (DETR recipe)': dict(rpe_on='k', rpe_cfg=dict(
        mode='contextual', method='product', ratio=1.9, init='xavier')),
    'bias cross qk, 1 skip token': dict(rpe_on='qk', skip=1, rpe_cfg=dict(
        mode='bias', method='cross', ratio=1.9, shared_head=False,
        init='xavier')),
    'contextual product qkv': dict(rpe_on='qkv', rpe_cfg=dict(
        mode='contextual', method='product', ratio=1.9, init='xavier')),
    'decomposed relative position': dict(rel_pos_cfg=dict(
        input_size=(20, 27), init='trunc_normal')),
}
FUSED_ARGS = '--rounds 10'


def train_call(core, grid, device, batch: int = 2,
               dtype: torch.dtype = torch.float32,
               round_to: Optional[torch.dtype] = None) -> List[torch.Tensor]:
    """Output and the gradients of q, k, v and of every parameter (by
    name) of one forward + backward of ``core.attend`` on seeded inputs of
    ``batch`` x 8 heads x 32 (``round_to``: the inputs rounded to that
    dtype first, then in ``dtype``); three rows of the last image padded."""
    torch.manual_seed(1)
    n = core.skip + grid[0] * grid[1]

    def rand(*shape):
        x = torch.randn(*shape, device=device)
        return (x if round_to is None else x.to(round_to)).to(dtype)

    q, k, v = (rand(batch, 8, n, 32).requires_grad_() for _ in range(3))
    mask = torch.zeros(batch, n, dtype=torch.bool, device=device)
    mask[-1, n - grid[1] * 3:] = True  # three padded rows in one image
    out = core.attend(q, k, v, grid, mask)
    out.backward(rand(*out.shape))
    grads = [q.grad, k.grad, v.grad] + [
        p.grad for _, p in sorted(core.named_parameters())]
    return [out.detach()] + grads


def _pair(device, cfg: Dict, dtype=torch.float32):
    """The fused core (in ``dtype``) and an explicit one (float32) with the
    same parameters."""
    from mmpe.models.layers import PEAttention
    torch.manual_seed(0)
    fused = PEAttention(256, 8, attn_impl='fused', **cfg).to(device, dtype)
    explicit = PEAttention(256, 8, attn_impl='explicit', **cfg).to(device)
    explicit.load_state_dict(
        {k: v.float() for k, v in fused.state_dict().items()})
    return fused, explicit


def _row(name: str, grid, dtype: str, diffs: List[float], tol: str,
         good: bool, note: str = '') -> dict:
    return dict(setting=name, grid=list(grid), dtype=dtype, diffs=diffs,
                tolerance=tol, ok=good, note=note)


def check_fused(device: torch.device, grids: Sequence = GRIDS,
                bf16_grid=BF16_GRID) -> Tuple[bool, List[str], dict]:
    """The fused kernel of ``device`` (``attn_impl='fused'``) against
    ``'explicit'``, forward and backward: float32 (TF32 off) over
    ``grids`` within :data:`CUDA_ATOL` times each tensor's largest value
    where that is above 1 (a table's gradient sums every pair's rounding);
    bfloat16 inputs and parameters at ``bf16_grid`` against float32 on the
    same rounded values within :data:`BF16_RTOL` of each tensor's largest
    value. A fallback (the
    module's warning) fails the row."""
    lines = ['## 3. The fused kernel (Triton) against explicit (forward and '
             'backward)', '', f'batch 2, 8 heads x 32, three rows of one '
             f'image padded; float32 (TF32 off): max abs diff <= {CUDA_ATOL} '
             "x max(1, the tensor's largest value); "
             f'bfloat16: max abs diff / largest value <= {BF16_RTOL} against '
             'float32 on the same bfloat16 values', '',
             '| setting | grid | L | dtype | out, dq, dk, dv, parameters '
             '| result |', '|---|---|---:|---|---|---|']
    rows = []
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for name, cfg in FUSED_SETTINGS.items():
        runs = [(grid, torch.float32) for grid in grids]
        runs.append((bf16_grid, torch.bfloat16))
        cores = {}
        for grid, dtype in runs:
            if dtype not in cores:
                cores[dtype] = _pair(device, cfg, dtype)
            fused, explicit = cores[dtype]
            low = dtype != torch.float32
            label = 'bfloat16' if low else 'float32'
            tol = (f'{BF16_RTOL} (relative)' if low else
                   f'{CUDA_ATOL} x max(1, largest)')
            fused.zero_grad()
            explicit.zero_grad()
            want = train_call(explicit, grid, device,
                              round_to=dtype if low else None)
            try:
                got = train_call(fused, grid, device, dtype=dtype)
            except Exception as e:  # a kernel failing to compile or run
                rows.append(_row(name, grid, label, [], tol, False,
                                 f'{type(e).__name__}: {str(e)[:160]!r}'))
                continue
            diffs = [float((g.float() - w).abs().max()) for g, w in
                     zip(got, want)]
            tops = [float(w.abs().max()) for w in want]
            if low:
                diffs = [d / max(top, 1e-12) for d, top in zip(diffs, tops)]
                within = all(d <= BF16_RTOL for d in diffs)
            else:
                within = all(d <= CUDA_ATOL * max(1.0, top)
                             for d, top in zip(diffs, tops))
            good = len(got) == len(want) and not fused._warned and within
            rows.append(_row(name, grid, label, diffs, tol, good,
                             '; '.join(sorted(fused._warned))))
    for r in rows:
        g = r['grid']
        skip = FUSED_SETTINGS[r['setting']].get('skip', 0)
        result = 'ok' if r['ok'] else 'FAILED' + (
            f" ({r['note']})" if r['note'] else '')
        lines.append(f"| {r['setting']} | {g[0]}x{g[1]} | "
                     f'{skip + g[0] * g[1]} | {r["dtype"]} | '
                     f"{', '.join(f'{d:.1e}' for d in r['diffs']) or '-'} | "
                     f'{result} |')
    lines.append('')
    return all(r['ok'] for r in rows), lines, dict(rows=rows)


def run_fused_benchmark(out_dir: str, extra: str = FUSED_ARGS
                        ) -> Tuple[bool, List[str], Optional[dict]]:
    """``tools/benchmark/fused_cuda.py`` on CUDA in its own process: its
    markdown table in the report, its JSON as the step's data."""
    out = os.path.join(out_dir, 'fused_cuda.json')
    md = os.path.join(out_dir, 'fused_cuda.md')
    cmd = [sys.executable, 'tools/benchmark/fused_cuda.py', '--device',
           'cuda', *shlex.split(extra), '--out', out, '--report', md]
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    ok = proc.returncode == 0
    lines = ['## 5. The fused kernel against SDPA: the aims', '',
             f'`{shlex.join(cmd[1:])}` ({time.time() - start:.0f} s, '
             f"{'ok' if ok else 'FAILED'})", '']
    if not ok:
        return False, lines + ['```text', *proc.stderr[-3000:].splitlines(),
                               '```', ''], None
    with open(md) as f:  # its title one level down
        lines += ['#' + line if line.startswith('# ') else line
                  for line in f.read().splitlines()] + ['']
    with open(out) as f:
        return True, lines, json.load(f)


def device_slug(name: str) -> str:
    """A device name as a file name: ``'NVIDIA H100 80GB HBM3'`` ->
    ``'nvidia-h100-80gb-hbm3'``."""
    slug = re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')
    if not slug:
        raise ValueError(f'device name {name!r} has no letter or digit to '
                         'name a file by')
    return slug


def versions() -> Dict[str, Optional[str]]:
    """torch, triton (None if absent) and CUDA (``torch.version.cuda``)."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return dict(torch=torch.__version__, triton=triton_version,
                cuda=torch.version.cuda)


def write_data(markdown: str, record: dict, data_dir: str) -> List[str]:
    """Write a report into ``data_dir`` as ``gpu_check_<device>.md`` and
    ``.json`` (``<device>``: :func:`device_slug` of
    ``record['env']['device_name']``); returns both paths. ``record`` must
    name the device and the versions (``env``: ``device_name``,
    ``torch``, ``triton``, ``cuda``), and the markdown must name the
    device."""
    env = record.get('env', {})
    missing = [k for k in ('device_name', 'torch', 'triton', 'cuda')
               if k not in env]
    if missing:
        raise ValueError(f'the record\'s env lacks {missing}: a data file '
                         'names the device and the versions')
    if env['device_name'] not in markdown:
        raise ValueError(f"the report does not name the device "
                         f"{env['device_name']!r}")
    os.makedirs(data_dir, exist_ok=True)
    stem = os.path.join(data_dir,
                        f"gpu_check_{device_slug(env['device_name'])}")
    with open(stem + '.md', 'w') as f:
        f.write(markdown if markdown.endswith('\n') else markdown + '\n')
    with open(stem + '.json', 'w') as f:
        json.dump(record, f, indent=1)
    return [stem + '.md', stem + '.json']


def summary_lines(results: Dict[str, bool]) -> List[str]:
    """The report's closing table: each step passed or FAILED."""
    return ['## Summary', '', '| check | result |', '|---|---|'] + [
        f"| {k} | {'passed' if v else 'FAILED'} |" for k, v in results.items()]


def write_report(lines: List[str], record: dict, out_dir: str,
                 data_dir: str) -> List[str]:
    """The report so far: ``lines`` and the summary of
    ``record['results']`` as ``out_dir``/report.md, ``record`` as
    report.json, the results as summary.json, and both files again in
    ``data_dir`` (:func:`write_data`); returns the paths of the latter."""
    text = '\n'.join(lines + summary_lines(record['results'])) + '\n'
    with open(os.path.join(out_dir, 'report.md'), 'w') as f:
        f.write(text)
    with open(os.path.join(out_dir, 'report.json'), 'w') as f:
        json.dump(record, f, indent=1)
    with open(os.path.join(out_dir, 'summary.json'), 'w') as f:
        json.dump(record['results'], f, indent=1)
    return write_data(text, record, data_dir)
