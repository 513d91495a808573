"""Check mmpe's CUDA paths on a machine with a GPU and write one report.

    python tools/gpu_check.py                  # or: make gpu-check
    python tools/gpu_check.py --skip-benchmarks --out-dir work_dirs/gpu
    python tools/gpu_check.py --benchmarks fused   # the kernel's aims only

Without CUDA it prints one line and exits 0. With CUDA, in order:

1. pytest of the test files with CUDA-only tests (they skip without CUDA):
   FlexAttention training against the explicit backend for every iRPE
   setting, ``attn_impl='auto'`` on CUDA, the shape policy's compilations,
   the backend rule, the fused Triton kernel (``CUDA_TESTS``).
2. FlexAttention forward and backward against ``'explicit'`` on CUDA over
   C5 grids of DETR's 150-epoch recipe (output, gradients of q, k, v and
   of the iRPE tables; float32, no TF32), with the compilations they cost.
3. The fused kernel (Triton, ``attn_impl='fused'``) against ``'explicit'``
   the same way, for contextual product on k, bias cross on qk with a
   skip token, contextual product on qkv and the decomposed relative
   position; and one bfloat16 row of each (``gpu_checks.check_fused``).
4. The memory estimates of the ``'auto'`` rule
   (``mmpe/models/layers/attention/backend_rule.py``) against the measured
   peak of each backend (``torch.cuda.max_memory_allocated``) on a DETR encoder
   call, and the backend ``'auto'`` picks here.
5. The aims of the fused kernel against SDPA without position encoding
   (``tools/benchmark/fused_cuda.py``), its table.
6. The long-sequence benchmark (``tools/benchmark/attention.py --long
   --device cuda``) and the backbone benchmark
   (``tools/benchmark/backbone.py``: CPU rows, it has no device option),
   their printed tables and JSON.

The report (markdown) goes to ``--out-dir``/report.md, the results of every
step (JSON) to ``--out-dir``/report.json; both also to ``--data-dir``
(default docs/data) as ``gpu_check_<device>.md`` / ``.json``, which name the
device and the versions of torch, Triton and CUDA (for a GPU session to
commit). They are written again after every step, so that a run cut short
keeps what it measured (``complete`` in the JSON says whether every step
ran). ``--benchmarks`` chooses among 5 and 6. The report's path is printed
last. Exit status 1 when a check failed.
"""
import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional, Tuple

import torch
from gpu_checks import (CUDA_ATOL, FUSED_ARGS, GRIDS, check_fused,
                        run_fused_benchmark, train_call, versions,
                        write_report)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..'))
#: test files holding CUDA-only tests
CUDA_TESTS = ('tests/test_models/test_layers/test_irpe_flex.py',
              'tests/test_models/test_layers/test_backend_rule.py',
              'tests/test_compile/test_flex_recompiles.py',
              'tests/test_models/test_layers/test_triton_attention.py')
#: the benchmark steps: --benchmarks name -> step name
BENCHMARKS = {'fused': 'fused-aims', 'long': 'long', 'backbone': 'backbone'}
LONG_ARGS = '--lengths 1050 4096 8192 --rounds 3'
BACKBONE_ARGS = '--depth 3 --archs s'


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out-dir', default='work_dirs/gpu_check')
    parser.add_argument('--data-dir', default=os.path.join(ROOT, 'docs',
                                                           'data'),
                        help='where the report is copied as '
                        'gpu_check_<device>.md / .json (default docs/data)')
    parser.add_argument('--skip-benchmarks', action='store_true',
                        help='only the tests and checks (minutes)')
    parser.add_argument('--benchmarks', nargs='+', default=list(BENCHMARKS),
                        choices=list(BENCHMARKS),
                        help='the benchmarks run (default: all)')
    parser.add_argument('--long-args', default=LONG_ARGS,
                        help='more arguments of attention.py --long')
    parser.add_argument('--fused-args', default=FUSED_ARGS,
                        help='more arguments of benchmark/fused_cuda.py')
    parser.add_argument('--backbone-args', default=BACKBONE_ARGS,
                        help='arguments of backbone.py')
    return parser.parse_args(argv)


def run_tests(out_dir: str) -> Tuple[bool, List[str]]:
    xml = os.path.join(out_dir, 'cuda_tests.xml')
    cmd = [sys.executable, '-m', 'pytest', '-q', '-rs', *CUDA_TESTS,
           f'--junitxml={xml}']
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == 'testsuite' else suite[0]
    n = {k: int(suite.get(k, 0))
         for k in ('tests', 'failures', 'errors', 'skipped')}
    ok = proc.returncode == 0 and n['skipped'] == 0
    lines = ['## 1. CUDA tests', '', f'`{shlex.join(cmd[1:])}`', '',
             '| tests | failures | errors | skipped | result |',
             '|---:|---:|---:|---:|---|',
             f"| {n['tests']} | {n['failures']} | {n['errors']} | "
             f"{n['skipped']} | {'passed' if ok else 'FAILED'} |", '',
             '```text', *proc.stdout.strip().splitlines()[-15:], '```', '']
    return ok, lines


def _cores(device: torch.device, cfg: Dict) -> list:
    from mmpe.models.layers import PEAttention
    cores = []
    for impl in ('explicit', 'flex'):
        torch.manual_seed(0)
        cores.append(PEAttention(256, 8, attn_impl=impl, **cfg).to(device))
    return cores


def check_flex(device: torch.device) -> Tuple[bool, List[str]]:
    settings = {
        'contextual product k (DETR recipe)': dict(rpe_on='k', rpe_cfg=dict(
            mode='contextual', method='product', ratio=1.9, init='xavier')),
        'bias cross qk, 1 skip token': dict(rpe_on='qk', skip=1, rpe_cfg=dict(
            mode='bias', method='cross', ratio=1.9, shared_head=False,
            init='xavier')),
    }
    lines = ['## 2. FlexAttention against explicit (forward and backward)',
             '', f'float32, TF32 off, batch 2, 8 heads x 32; tolerance '
             f'{CUDA_ATOL} (absolute)', '',
             '| setting | grid | L | max abs diff: out, dq, dk, dv, tables '
             '| result |', '|---|---|---:|---|---|']
    ok = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    for name, cfg in settings.items():
        explicit, flex = _cores(device, cfg)
        for grid in GRIDS:
            want = train_call(explicit, grid, device)
            try:
                got = train_call(flex, grid, device)
            except Exception as e:  # e.g. the backward failing to compile
                ok = False
                lines.append(f'| {name} | {grid[0]}x{grid[1]} | '
                             f'{want[0].shape[2]} | - | FAILED '
                             f'({type(e).__name__}: {str(e)[:160]!r}) |')
                continue
            diffs = [(g - w).abs().max().item() for g, w in zip(got, want)]
            good = (max(diffs) <= CUDA_ATOL and not flex._warned
                    and not flex._flex_failed)
            ok &= good
            note = '' if not flex._warned else f' ({sorted(flex._warned)})'
            lines.append(
                f'| {name} | {grid[0]}x{grid[1]} | {want[0].shape[2]} | '
                f"{', '.join(f'{d:.1e}' for d in diffs)} | "
                f"{'ok' if good else 'FAILED' + note} |")
    lines += ['', f"compilations (dynamo graphs): "
              f"{counters['stats']['unique_graphs']} for "
              f'{len(settings) * len(GRIDS)} calls', '']
    return ok, lines


def _peak(core, grid, device) -> float:
    from mmpe.utils.benchmark_helpers import cuda_peak_bytes
    return cuda_peak_bytes(lambda: train_call(core, grid, device), device)


def check_memory(device: torch.device) -> Tuple[bool, List[str]]:
    from mmpe.models.layers import PEAttention
    from mmpe.models.layers.attention.backend_rule import (AttentionCall,
                                                           auto_backend,
                                                           cuda_free_bytes,
                                                           memory_estimate)
    grid = (34, 34)
    call = AttentionCall(grid[0] * grid[1], True, device_type='cuda',
                         batch=2, heads=8, head_dim=32)
    lines = ['## 4. Memory estimates of the auto rule against measured peaks',
             '', f'one DETR encoder call: batch 2, 8 heads x 32, grid '
             f'{grid[0]}x{grid[1]}, float32, forward + backward; measured: '
             'peak allocated minus the allocation before the call (it also '
             'counts q, k, v gradients and the output, which the estimate '
             'leaves out)', '',
             '| backend | estimate MiB | measured MiB | measured / estimate |',
             '|---|---:|---:|---:|']
    for impl in ('explicit', 'chunked', 'flex'):
        torch.manual_seed(0)
        core = PEAttention(256, 8, attn_impl=impl, rpe_on='k', rpe_cfg=dict(
            mode='contextual', method='product', ratio=1.9,
            init='xavier')).to(device)
        train_call(core, grid, device)  # warm-up: compilation, caches
        peak = _peak(core, grid, device)
        est = memory_estimate(impl, call)
        lines.append(f'| {impl} | {est / 2**20:.1f} | {peak / 2**20:.1f} | '
                     f'{peak / est:.2f} |')
    free = cuda_free_bytes(device)
    picks = {f'{name} (L={c.length})': auto_backend(c, True, False, free)
             for name, c in (
                 ('DETR 34x34, batch 2', call),
                 ('ViT-B 64x64, batch 2', AttentionCall(
                     4096, True, device_type='cuda', batch=2, heads=12,
                     head_dim=64)))}
    lines += ['', f'free memory now: {free / 2**30:.1f} GiB; auto picks: ' +
              '; '.join(f'{k}: {v}' for k, v in picks.items()), '']
    return True, lines


def run_benchmark(title: str, script: str, args: List[str],
                  out: str) -> Tuple[bool, List[str], Optional[dict]]:
    cmd = [sys.executable, script, *args, '--out', out]
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    ok = proc.returncode == 0
    text = proc.stdout if ok else proc.stdout + proc.stderr[-3000:]
    data = None
    if ok and os.path.isfile(out):
        with open(out) as f:
            data = json.load(f)
    return ok, [f'## {title}', '', f'`{shlex.join(cmd[1:])}` '
                f'({time.time() - start:.0f} s, '
                f"{'ok' if ok else 'FAILED'}; JSON: {out})", '',
                '```text', *text.strip().splitlines(), '```', ''], data


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(f'gpu-check: no CUDA device (torch {torch.__version__}), '
              'nothing checked')
        return 0
    out_dir = os.path.abspath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    device = torch.device('cuda')
    from mmpe.utils.bench_env import benchmark_env, env_line
    ver = versions()
    env = benchmark_env(device, triton=ver['triton'], cuda=ver['cuda'])
    lines = ['# mmpe gpu-check', '',
             f"{env['date']}; {env_line(env)}; triton {env['triton']}; "
             f"CUDA {env['cuda']}; {platform.node()}", '']
    results, steps_data = {}, {}
    steps = [('tests', lambda: run_tests(out_dir)),
             ('flex', lambda: check_flex(device)),
             ('fused', lambda: check_fused(device)),
             ('memory', lambda: check_memory(device))]
    if not args.skip_benchmarks:
        chosen = {BENCHMARKS[b] for b in args.benchmarks}
        steps += [step for step in [
            ('fused-aims', lambda: run_fused_benchmark(out_dir,
                                                       args.fused_args)),
            ('long', lambda: run_benchmark(
                '6. Long sequences (CUDA)', 'tools/benchmark/attention.py',
                ['--long', '--device', 'cuda',
                 *shlex.split(args.long_args)],
                os.path.join(out_dir, 'long.json'))),
            ('backbone', lambda: run_benchmark(
                '7. Backbone (CPU rows)', 'tools/benchmark/backbone.py',
                shlex.split(args.backbone_args),
                os.path.join(out_dir, 'backbone.json')))]
            if step[0] in chosen]
    report = os.path.join(out_dir, 'report.md')
    for i, (name, step) in enumerate(steps):
        print(f'gpu-check: {name} ...', flush=True)
        start = time.time()
        try:
            ok, part, *data = step()
        except Exception as e:  # report it, go on with the other checks
            ok, part, data = False, [f'## {name}: ERROR', '', '```text',
                                     f'{type(e).__name__}: {e}', '```',
                                     ''], []
        results[name] = ok
        steps_data[name] = dict(ok=ok, seconds=round(time.time() - start, 1),
                                data=data[0] if data else None, report=part)
        lines += part
        # written after every step: a run cut short keeps what it measured
        data_files = write_report(
            lines, dict(env=env, host=platform.node(), args=vars(args),
                        complete=i + 1 == len(steps),
                        passed=all(results.values()), results=results,
                        steps=steps_data), out_dir, args.data_dir)
    print(f'gpu-check: {"passed" if all(results.values()) else "FAILED"}; '
          f"data: {', '.join(data_files)}; report: {report}")
    return 0 if all(results.values()) else 1


if __name__ == '__main__':
    sys.exit(main())
