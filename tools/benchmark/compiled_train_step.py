"""The train-step part of ``compiled.py`` (``--parts train_step``): the
quick-start DETR-iRPE's ``model.train_step`` eager against
``torch.compile(model.train_step)`` as MMEngine's runner compiles it for
``compile=True``, on two batches of different image sizes (the second size
recompiles); a compile error is recorded and the compiled model run again
with dynamo's ``suppress_errors=True``."""
import argparse
import os
import statistics
import time
import warnings
from typing import Dict, List

import torch
import torch._dynamo
import train_step as train_bench
from mmdet.utils import register_all_modules

import mmpe  # noqa: F401  (registers mmpe's modules)
from mmpe.engine.plain_param_groups_hook import plain_param_groups

MODES = ('eager', 'compiled')
#: the repository root: a relative ``--train-config`` is looked up there too
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))


def _error_summary(err: Exception) -> str:
    """First line of a compile error and the user code it points at."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    where = [
        lines[i + 1].strip() for i, line in enumerate(lines[:-1])
        if line.startswith('from user code')
    ]
    text = f'{type(err).__name__}: {lines[0] if lines else ""}'
    return text + (f' (at {where[0]})' if where else '')


def _build_train_step(cfg: str, device: torch.device):
    """Model, optimiser wrapper and classes of a config, the parameter
    groups made plain dicts as ``tools/train.py`` does for every config
    (``PlainParamGroupsHook``; TorchDynamo needs them to trace
    ``optimizer.step()``)."""
    model, optim, num_classes = train_bench.build(cfg, device)
    plain_param_groups(optim.optimizer)
    return model, optim, num_classes


def _compiled_train_step(cfg: str, backend: str, device: torch.device):
    """A quick-start model whose ``train_step`` is compiled as
    ``Runner._maybe_compile`` compiles it for ``compile=True``."""
    model, optim, _ = _build_train_step(cfg, device)
    kwargs = {} if backend == 'inductor' else dict(backend=backend)
    model.train_step = torch.compile(model.train_step, **kwargs)
    return model, optim


def train_step_part(args: argparse.Namespace, device: torch.device) -> dict:
    """The quick-start train step, eager against ``torch.compile``.

    If the compiled step raises (a frame dynamo cannot convert, which
    MMEngine's ``compile=True`` does not catch), the error is recorded and
    the compiled model is rebuilt and run with dynamo's
    ``suppress_errors=True`` (such frames run eagerly), labelled so.
    """
    register_all_modules(init_default_scope=True)
    cfg = args.train_config
    if not os.path.isabs(cfg) and not os.path.exists(cfg):
        cfg = os.path.join(ROOT, cfg)
    eager_model, eager_optim, num_classes = _build_train_step(cfg, device)
    batches = [
        train_bench.make_batch(args.train_batch, args.min_size,
                               args.max_size, num_classes, seed)
        for seed in args.train_seeds
    ]
    shapes = [[list(t.shape[-2:]) for t in b['inputs']] for b in batches]
    padded = [[max(s[0] for s in ss), max(s[1] for s in ss)]
              for ss in shapes]
    if len({tuple(p) for p in padded}) != len(padded):
        raise ValueError(f'`--train-seeds` {args.train_seeds} give batches '
                         f'of one padded size {padded}; choose other seeds')
    counters = torch._dynamo.utils.counters
    torch._dynamo.reset()  # the attention rows' graphs are done with
    counters.clear()
    compiled_model, compiled_optim = _compiled_train_step(
        cfg, args.backend, device)
    first: Dict[str, List[float]] = {mode: [] for mode in MODES}
    times = {mode: [[] for _ in batches] for mode in MODES}
    mmengine_error = failed_after_s = None
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        first['eager'].append(
            train_bench.step(eager_model, eager_optim, batches[0], device))
        t0 = time.perf_counter()
        try:
            first['compiled'].append(
                train_bench.step(compiled_model, compiled_optim, batches[0],
                                 device))
        except Exception as err:  # noqa: B902  (recorded, then worked around)
            failed_after_s = time.perf_counter() - t0
            mmengine_error = _error_summary(err)
            print(f'compiled train_step failed after {failed_after_s:.1f} '
                  f's: {mmengine_error}\n-> rebuilt and run with '
                  'torch._dynamo.config.suppress_errors=True', flush=True)
            torch._dynamo.reset()
            counters.clear()
            compiled_model, compiled_optim = _compiled_train_step(
                cfg, args.backend, device)
        models = dict(
            eager=(eager_model, eager_optim),
            compiled=(compiled_model, compiled_optim))
        with torch._dynamo.config.patch(
                suppress_errors=mmengine_error is not None):
            # first steps: compile, then recompile for the new size
            for b, packed in enumerate(batches):
                for mode, (model, optim) in models.items():
                    if len(first[mode]) > b:
                        continue
                    first[mode].append(
                        train_bench.step(model, optim, packed, device))
                    if args.verbose:
                        print(f'  first {mode} step on batch {b}: '
                              f'{first[mode][-1]:.1f} s', flush=True)
            breaks = dict(counters['graph_break'])
            graphs = int(counters['stats']['unique_graphs'])
            for r in range(args.train_warmup + args.train_rounds):
                for b, packed in enumerate(batches):
                    for mode, (model, optim) in models.items():
                        t = train_bench.step(model, optim, packed, device)
                        if r >= args.train_warmup:
                            times[mode][b].append(t)
    rows = []
    for mode in MODES:
        label = mode if mode == 'eager' or mmengine_error is None else (
            f'{mode} (suppress_errors)')
        rows.append(
            dict(mode=label, first_step_s=first[mode],
                 median_step_s=[statistics.median(ts) for ts in times[mode]],
                 steps_s=times[mode]))
    for row in rows:
        row['compiled_over_eager'] = [
            m / e for m, e in zip(row['median_step_s'], rows[0]
                                  ['median_step_s'])
        ]
    res = dict(
        config=args.train_config,
        backend=args.backend,
        mmengine_compile_error=mmengine_error,
        mmengine_compile_failed_after_s=failed_after_s,
        batch_image_shapes=shapes,
        padded_sizes=padded,
        graphs=graphs,
        graph_breaks=sum(breaks.values()),
        graph_break_reasons={
            k.splitlines()[0][:160]: v
            for k, v in sorted(breaks.items(), key=lambda kv: -kv[1])[:10]
        },
        rows=rows)
    print(f'\ntrain step of {args.train_config} ({args.train_batch} images '
          f'a batch, padded to {padded}); backend {args.backend}, '
          f'dynamic=None; median of {args.train_rounds} round-robin steps '
          f'after {args.train_warmup} warm-up; {graphs} graphs, '
          f'{res["graph_breaks"]} graph breaks')
    head = f'{"mode":<28}' + ''.join(
        f'{f"1st s b{i}":>11}{f"step s b{i}":>11}{"c/e":>6}'
        for i in range(len(batches)))
    print(head)
    print('-' * len(head))
    for row in rows:
        print(f'{row["mode"]:<28}' + ''.join(
            f'{f:>11.2f}{m:>11.3f}{r:>6.2f}'
            for f, m, r in zip(row['first_step_s'], row['median_step_s'],
                               row['compiled_over_eager'])))
    if mmengine_error:
        print(f'MMEngine compile=True as is: {mmengine_error}')
    for reason, n in res['graph_break_reasons'].items():
        print(f'  graph break x{n}: {reason}')
    return res
