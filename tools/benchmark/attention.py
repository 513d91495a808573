"""Speed and peak memory of iRPE attention against mmcv's MultiheadAttention.

Measures one encoder self-attention layer and a whole 6-layer DETR encoder
(mmdet's ``DetrTransformerEncoder`` against mmpe's iRPE encoder of
``mmpe/models/detectors/detr_irpe.py``) at DETR feature grids (25 x 42 = an
800 x 1333 image at stride 32 by default; 13 x 21 and 50 x 84 with
``--grids``), batch 2, 256 dims, 8 heads. The second image of the batch is
padded at the bottom / right like mmdet pads a batch (``--pad``), so key
padding masks are exercised.

Rows (layer level):

* ``mmcv MHA`` - mmcv's ``MultiheadAttention`` (wrapping
  ``nn.MultiheadAttention``), the baseline every ratio refers to;
* ``mmpe no RPE`` - :class:`iRPEMultiheadAttention` with ``rpe_cfg=None``;
* ``mmpe {bias,ctx} {product,cross,euclidean,quant} {k,qk,qkv}`` (bias: k,
  qk only) with ``attn_impl='explicit'``, tables Xavier-initialised;
* ``Eq.27-28 ctx product k`` - the paper's Eq. 27-28 as written, a reference
  of what mmpe improves on: the (B, H, L, num_buckets) lookup ``q @ R^T`` is
  flattened and indexed with ``i * num_buckets + bucket(i, j)`` (an (L, L)
  long index), added to the logits, then ``masked_fill``, softmax, ``@ v``;
* ``mmpe ... (sdpa)`` - ``attn_impl='sdpa'``: the iRPE terms on queries /
  keys materialised (with their gradient) as the float mask of
  ``F.scaled_dot_product_attention`` (no iRPE on values there);
* ``mmpe ctx product k (plain softmax)`` and ``(plain softmax, add_)`` - the
  explicit ``mmpe ctx product k`` row with, for that row's calls only,
  ``mmpe.models.layers.attention.ops.masked_softmax`` (the in-place softmax
  built on the private ``aten._softmax.out`` /
  ``_softmax_backward_data.out``) replaced by ``torch.softmax(logits +
  mask, -1)``, resp. by ``logits.add_(mask)`` then ``torch.softmax(logits,
  -1)`` (see :func:`plain_softmax`). The A/B of issue 11 item 5; fwd+bwd
  only, since without gradient the explicit backend runs SDPA and never
  calls the softmax;
* ``mmpe ... (flex)`` - ``attn_impl='flex'`` (FlexAttention, opt-in, never
  chosen automatically; compiled once per shape before timing). On CPU
  only the forward exists in PyTorch 2.13, so its fwd+bwd columns are empty
  there.

Encoder rows: the same backends on a 6-layer encoder (``... encoder``).

What is measured, per row:

* ``fwd+bwd ms``: wall time of ``out = layer(x, ...)`` then
  ``out.backward(g)`` with ``x`` requiring grad (training); ``fwd ms``: wall
  time of the forward under ``torch.no_grad()`` (inference; here mmpe's
  explicit backend hands the constant iRPE terms to
  ``scaled_dot_product_attention``, as ``'sdpa'`` does).
  Rows are run round-robin (one repetition of every row, then the next
  round), after one warm-up round; the median over ``--rounds`` rounds is
  reported, and every ratio divides by the baseline's median from the same
  run. On CUDA the clock is read after ``torch.cuda.synchronize()``.
* ``peak MB``: the largest amount of memory held by tensors allocated during
  one run, above what was allocated when the run started (inputs, weights
  and cached bucket tables are not counted; parameter gradients are). On
  CPU it is the maximum of the running sum of the allocation / free events
  recorded by ``torch.profiler.profile(profile_memory=True)`` (every tensor
  allocation through PyTorch's CPU allocator, in time order); on CUDA it is
  ``torch.cuda.max_memory_allocated()`` after
  ``torch.cuda.reset_peak_memory_stats()``, minus the allocation at the
  start. Measured in separate, untimed runs.

Run on a quiet machine (``uptime``: load below the number of cores)::

    python tools/benchmark/attention.py --out work_dirs/bench_attention.json
    python tools/benchmark/attention.py --grids 13x21 25x42 50x84 \\
        --variants 'mmcv|ctx product k|bias product k|Eq' --no-encoder
    python tools/benchmark/attention.py --quick --out /tmp/quick.json
"""
import argparse
import contextlib
import json
import math
import os
import platform
import re
import statistics
import sys
import time
import warnings
from datetime import datetime, timezone
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch._dynamo
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mmcv.cnn.bricks.transformer import MultiheadAttention  # noqa: E402
from mmdet.models.layers import DetrTransformerEncoder  # noqa: E402

from mmpe.models.detectors.detr_irpe import \
    iRPEDetrTransformerEncoder  # noqa: E402
from mmpe.models.layers.attention import ops as attention_ops  # noqa: E402
from mmpe.models.layers.attention.flex import \
    flex_unsupported_reason  # noqa: E402
from mmpe.models.layers.blocks.irpe_attention import \
    iRPEMultiheadAttention  # noqa: E402

BASELINE = 'mmcv MHA'
EQ27 = 'Eq.27-28 ctx product k'
# the softmax A/B of issue 11 item 5: in-place private-ATen softmax (A)
# against public torch.softmax (B); the private calls stay only if
# B / A >= SOFTMAX_KEEP (fwd+bwd at 25 x 42)
SOFTMAX_A = 'mmpe ctx product k'
SOFTMAX_B = ('mmpe ctx product k (plain softmax)',
             'mmpe ctx product k (plain softmax, add_)')
SOFTMAX_KEEP = 1.10
MODES = {'bias': ('k', 'qk'), 'ctx': ('k', 'qk', 'qkv')}
METHODS = ('product', 'cross', 'euclidean', 'quant')
# Targets of issue 5 (CPU, 25 x 42, fwd+bwd), checked on the layer rows
TARGETS = dict(
    ctx_product_k_time=1.5,  # x baseline time, aim 1.25
    bias_time=1.3,  # x baseline time, every bias row
    ctx_product_k_memory=1.3,  # x baseline peak memory
    eq27_speedup=1.5)  # Eq. 27-28 time / mmpe time


# ---------------------------------------------------------------------------
# the Eq. 27-28 reference
# ---------------------------------------------------------------------------
class Eq27Attention(iRPEMultiheadAttention):
    """Contextual iRPE on keys computed as Eq. 27-28 of the paper reads.

    ``y = q @ R^T`` (B, H, L, nb) is flattened to (B, H, L * nb) and indexed
    with the (L, L) long index ``i * nb + bucket(i, j)``; its backward is an
    index-put with accumulation (a scatter-add). Shares the projections and
    the table (``rpe_k``) of :class:`iRPEMultiheadAttention`.
    """

    def attention(self, query: Tensor, key: Tensor, value: Tensor,
                  attn_mask: Optional[Tensor],
                  key_padding_mask: Optional[Tensor],
                  spatial_shape: Tuple[int, int],
                  rope_pos: Optional[Tensor] = None) -> Tensor:
        # no RoPE in this reference: rope_pos is accepted and unused
        w_q, w_k, w_v = self.attn.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.attn.in_proj_bias.chunk(3)
        q = self.split_heads(F.linear(query, w_q, b_q))
        k = self.split_heads(F.linear(key, w_k, b_k))
        v = self.split_heads(F.linear(value, w_v, b_v))
        q = q * (1.0 / math.sqrt(self.head_dims))
        bs, heads, n, _ = q.shape
        height, width = spatial_shape
        table = self.rpe_k.table[0]  # (nb, head_dims), shared heads
        nb = table.shape[0]
        if getattr(self, '_flat_key', None) != (height, width, q.device):
            ids = self.rpe_k.bucket_ids(height, width, q.device)
            offset = torch.arange(n, device=q.device)[:, None] * nb
            self._flat = (ids + offset).flatten()  # i * nb + bucket(i, j)
            self._flat_key = (height, width, q.device)
        lookup = (q @ table.t()).flatten(2)  # (B, H, L * nb)
        term = lookup[:, :, self._flat].view(bs, heads, n, n)
        logits = q @ k.transpose(-2, -1) + term
        if key_padding_mask is not None:
            logits = logits.masked_fill(
                key_padding_mask[:, None, None, :].bool(), float('-inf'))
        out = logits.softmax(-1) @ v
        return self.attn.out_proj(out.transpose(1, 2).flatten(2))


# ---------------------------------------------------------------------------
# the plain-softmax variant of the A/B
# ---------------------------------------------------------------------------
def _softmax_plus(logits: Tensor, mask: Optional[Tensor]) -> Tensor:
    """``torch.softmax(logits + mask, -1)``: public ops, new buffers."""
    return torch.softmax(logits if mask is None else logits + mask, -1)


def _softmax_add_(logits: Tensor, mask: Optional[Tensor]) -> Tensor:
    """The mask added into the (fresh) logits, then ``torch.softmax``."""
    if mask is not None:
        logits.add_(mask)
    return torch.softmax(logits, -1)


@contextlib.contextmanager
def plain_softmax(in_place_mask: bool = False) -> Iterator[None]:
    """Within the block, :class:`PEAttention`'s explicit backend uses a
    public ``torch.softmax`` instead of its in-place ``masked_softmax``
    (for one benchmark row; mmpe itself has no such switch)."""
    saved = attention_ops.masked_softmax
    attention_ops.masked_softmax = (
        _softmax_add_ if in_place_mask else _softmax_plus)
    try:
        yield
    finally:
        attention_ops.masked_softmax = saved


# ---------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------
class Row:
    """One benchmarked module and how to call it.

    Args:
        name (str): Row label.
        module (nn.Module): The layer or encoder.
        call (callable): ``call(module, x, inputs) -> Tensor``.
        backward (bool): Whether fwd+bwd is timed.
        forward (bool): Whether the no-grad forward is timed.
    """

    def __init__(self, name: str, module: nn.Module,
                 call: Callable[..., Tensor], backward: bool,
                 forward: bool) -> None:
        self.name, self.module, self.call = name, module, call
        self.backward, self.forward = backward, forward
        self.times: Dict[str, List[float]] = {'fwd_bwd': [], 'fwd': []}
        self.peak: Dict[str, Optional[float]] = {'fwd_bwd': None, 'fwd': None}


def _rpe_cfg(mode: str, method: str) -> dict:
    return dict(
        mode='contextual' if mode == 'ctx' else mode,
        method=method,
        index='piecewise',
        ratio=1.9,
        shared_head=True,
        init='xavier')  # non-zero tables, as after training


def layer_rows(args: argparse.Namespace, device: torch.device,
               flex_ok: Dict[str, bool]) -> List[Row]:
    """Every single-layer row (filtered by ``--variants`` later)."""
    dims, heads = args.dims, args.heads
    common = layer_kwargs(args)

    def mmcv_call(m, x, s):
        return m(x, query_pos=s.pos, key_padding_mask=s.mask)

    def irpe_call(m, x, s):
        return m(x, query_pos=s.pos, key_padding_mask=s.mask,
                 spatial_shape=s.grid)

    torch.manual_seed(0)
    rows = [
        (BASELINE, MultiheadAttention(dims, heads, **common), mmcv_call, True,
         True),
        ('mmpe no RPE',
         iRPEMultiheadAttention(dims, heads, rpe_cfg=None, **common),
         irpe_call, True, True),
    ]
    for mode, ons in MODES.items():
        for method in METHODS:
            for on in ons:
                m = iRPEMultiheadAttention(
                    dims, heads, rpe_cfg=_rpe_cfg(mode, method), rpe_on=on,
                    attn_impl='explicit', **common)
                rows.append((f'mmpe {mode} {method} {on}', m, irpe_call, True,
                             True))
    for name, add_ in zip(SOFTMAX_B, (False, True)):

        def plain_call(m, x, s, add_=add_):
            with plain_softmax(add_):
                return irpe_call(m, x, s)

        rows.append((name,
                     iRPEMultiheadAttention(
                         dims, heads, rpe_cfg=_rpe_cfg('ctx', 'product'),
                         rpe_on='k', attn_impl='explicit', **common),
                     plain_call, True, False))
    rows.append(('mmpe no RPE (sdpa)',
                 iRPEMultiheadAttention(
                     dims, heads, rpe_cfg=None, attn_impl='sdpa', **common),
                 irpe_call, True, True))
    for mode in ('bias', 'ctx'):
        for on in ('k', 'qk'):
            m = iRPEMultiheadAttention(
                dims, heads, rpe_cfg=_rpe_cfg(mode, 'product'), rpe_on=on,
                attn_impl='sdpa', **common)
            rows.append((f'mmpe {mode} product {on} (sdpa)', m, irpe_call,
                         True, True))
    rows.append((EQ27,
                 Eq27Attention(dims, heads,
                               rpe_cfg=_rpe_cfg('ctx', 'product'),
                               rpe_on='k', **common), irpe_call, True, True))
    for mode in ('ctx', 'bias'):
        for on in ('k', 'qk'):
            m = iRPEMultiheadAttention(
                dims, heads, rpe_cfg=_rpe_cfg(mode, 'product'), rpe_on=on,
                attn_impl='flex', **common)
            rows.append((f'mmpe {mode} product {on} (flex)', m, irpe_call,
                         flex_ok['fwd_bwd'], flex_ok['fwd']))
    return [Row(n, m.to(device), c, b, f) for n, m, c, b, f in rows]


def layer_kwargs(args: argparse.Namespace) -> dict:
    """Keyword arguments of a single attention layer row: batch first,
    ``args.dropout`` on the probabilities only. ``dropout_layer`` is always
    given: mmcv 2.1.0's ``MultiheadAttention`` writes the deprecated
    ``dropout`` key of any earlier call (mmdet's DETR configs use it) into
    its default ``dropout_layer``, so a baseline that relies on the default
    may get another layer's dropout."""
    return dict(
        batch_first=True,
        attn_drop=args.dropout,
        dropout_layer=dict(type='Dropout', drop_prob=0.))


def encoder_layer_cfg(args: argparse.Namespace, **attn) -> dict:
    """``layer_cfg`` of a DETR encoder layer (``args.dims`` channels,
    ``args.heads`` heads, FFN 8x wide); ``attn`` goes to the
    self-attention (mmpe's keys: ``rpe_cfg``, ``rpe_on``, ...).
    ``args.dropout`` goes where mmdet's DETR configs' ``dropout`` puts it
    (attention probabilities and the shortcut branch), spelt out: the
    deprecated key would change mmcv's default (see
    :func:`layer_kwargs`)."""
    return dict(
        self_attn_cfg=dict(
            embed_dims=args.dims,
            num_heads=args.heads,
            attn_drop=args.dropout,
            dropout_layer=dict(type='Dropout', drop_prob=args.dropout),
            batch_first=True,
            **attn),
        ffn_cfg=dict(
            embed_dims=args.dims,
            feedforward_channels=8 * args.dims,
            num_fcs=2,
            ffn_drop=args.dropout,
            act_cfg=dict(type='ReLU', inplace=True)))


def encoder_rows(args: argparse.Namespace, device: torch.device,
                 flex_ok: Dict[str, bool]) -> List[Row]:
    """6-layer DETR encoders: mmdet's against mmpe's iRPE encoder."""

    def layer_cfg(**attn):
        return encoder_layer_cfg(args, **attn)

    def mmdet_call(m, x, s):
        return m(query=x, query_pos=s.pos, key_padding_mask=s.mask)

    def irpe_call(m, x, s):
        return m(query=x, query_pos=s.pos, key_padding_mask=s.mask,
                 spatial_shape=s.grid)

    torch.manual_seed(0)
    n = args.encoder_layers
    rows = [(f'{BASELINE} encoder',
             DetrTransformerEncoder(num_layers=n, layer_cfg=layer_cfg()),
             mmdet_call, True, True),
            ('mmpe no RPE encoder',
             iRPEDetrTransformerEncoder(
                 num_layers=n, layer_cfg=layer_cfg(rpe_cfg=None)), irpe_call,
             True, True)]
    for mode, on, impl in (('ctx', 'k', 'explicit'), ('bias', 'k',
                                                      'explicit'),
                           ('ctx', 'qkv', 'explicit'), ('ctx', 'k', 'sdpa'),
                           ('ctx', 'k', 'flex')):
        enc = iRPEDetrTransformerEncoder(
            num_layers=n,
            layer_cfg=layer_cfg(
                rpe_cfg=_rpe_cfg(mode, 'product'), rpe_on=on,
                attn_impl=impl))
        flex = impl == 'flex'
        name = f'mmpe {mode} product {on} encoder' + (
            '' if impl == 'explicit' else f' ({impl})')
        rows.append((name, enc, irpe_call,
                     flex_ok['fwd_bwd'] if flex else True,
                     flex_ok['fwd'] if flex else True))
    return [Row(n, m.to(device), c, b, f) for n, m, c, b, f in rows]


# ---------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------
class Inputs:
    """A padded DETR batch: tokens, positions, key padding mask, grid."""

    def __init__(self, batch: int, grid: Tuple[int, int], dims: int,
                 pad: float, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(0)
        h, w = grid
        n = h * w
        self.grid = grid
        self.x = torch.randn(batch, n, dims, generator=gen).to(device)
        self.pos = torch.randn(batch, n, dims, generator=gen).to(device)
        self.grad = torch.randn(batch, n, dims, generator=gen).to(device)
        mask = torch.zeros(batch, h, w, dtype=torch.bool)
        if batch > 1 and pad > 0:
            # the last image is the smaller one: padded bottom / right
            mask[-1, h - int(pad * h):] = True
            mask[-1, :, w - int(pad * w):] = True
        self.mask = mask.flatten(1).to(device)


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _run(row: Row, s: Inputs, what: str) -> None:
    if what == 'fwd':
        with torch.no_grad():
            row.call(row.module, s.x, s)
        return
    x = s.x.detach().requires_grad_()
    row.call(row.module, x, s).backward(s.grad)


def _clear_grads(row: Row) -> None:
    for p in row.module.parameters():
        p.grad = None


def time_once(row: Row, s: Inputs, what: str, device: torch.device) -> float:
    """Seconds of one forward (no grad) or forward + backward."""
    _clear_grads(row)
    _sync(device)
    t0 = time.perf_counter()
    _run(row, s, what)
    _sync(device)
    return time.perf_counter() - t0


def peak_memory(row: Row, s: Inputs, what: str,
                device: torch.device) -> Optional[float]:
    """Peak bytes held by tensors allocated during one run (see the module
    docstring), or None if the profiler cannot tell."""
    _clear_grads(row)
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        _run(row, s, what)
        torch.cuda.synchronize(device)
        return float(torch.cuda.max_memory_allocated(device) - base)
    try:
        from torch._C._profiler import _EventType
        from torch.profiler import ProfilerActivity, profile
    except ImportError:  # pragma: no cover
        return None
    with profile(activities=[ProfilerActivity.CPU],
                 profile_memory=True) as prof:
        _run(row, s, what)
    sizes = []

    def walk(events):
        for e in events:
            if e.typed[0] == _EventType.Allocation:
                sizes.append((e.start_time_ns, e.typed[1].alloc_size))
            walk(e.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    live = peak = 0
    for _, size in sorted(sizes, key=lambda t: t[0]):
        live += size
        peak = max(peak, live)
    return float(peak)


def measure(rows: List[Row], s: Inputs, args: argparse.Namespace,
            device: torch.device) -> None:
    """Warm up, then interleaved timed rounds, then peak memory."""
    whats = [w for w in ('fwd_bwd', 'fwd') if w in args.passes]
    for row in rows:  # warm-up: bucket caches, flex compilation
        for what in whats:
            if getattr(row, 'backward' if what == 'fwd_bwd' else 'forward'):
                time_once(row, s, what, device)
    for r in range(args.rounds):
        for what in whats:
            for row in rows:
                if getattr(row,
                           'backward' if what == 'fwd_bwd' else 'forward'):
                    row.times[what].append(time_once(row, s, what, device))
        if args.verbose:
            print(f'  round {r + 1}/{args.rounds} done', flush=True)
    if args.no_memory:
        return
    for what in whats:
        for row in rows:
            if getattr(row, 'backward' if what == 'fwd_bwd' else 'forward'):
                row.peak[what] = peak_memory(row, s, what, device)


def profile_rows(rows: List[Row], s: Inputs, pattern: str,
                 device: torch.device, top: int = 12) -> Dict[str, list]:
    """Where the fwd+bwd time goes: the ``top`` ops by self time (3 runs
    under ``torch.profiler``) of the rows matching ``pattern``."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU]
    if device.type == 'cuda':
        acts.append(ProfilerActivity.CUDA)
    out = {}
    for row in rows:
        if not row.backward or not re.search(pattern, row.name):
            continue
        with profile(activities=acts, record_shapes=True) as prof:
            for _ in range(3):
                time_once(row, s, 'fwd_bwd', device)
        stats = prof.key_averages(group_by_input_shape=True)
        key = ('self_device_time_total'
               if device.type == 'cuda' else 'self_cpu_time_total')
        total = sum(getattr(e, key) for e in stats) or 1.0
        ops = sorted(stats, key=lambda e: -getattr(e, key))[:top]
        out[row.name] = [
            dict(op=e.key, shapes=str(e.input_shapes)[:120],
                 calls=e.count // 3, ms=getattr(e, key) / 3e3,
                 share=getattr(e, key) / total) for e in ops
        ]
        print(f'\nprofile of {row.name!r} (fwd+bwd, per run):')
        for o in out[row.name]:
            print(f'  {o["ms"]:8.1f} ms {100 * o["share"]:5.1f}%  '
                  f'{o["op"]:<32} x{o["calls"]:<3} {o["shapes"]}')
    return out


def summarise(rows: List[Row], base_name: str) -> List[dict]:
    """Medians and ratios to the row ``base_name``."""
    base = next(r for r in rows if r.name == base_name)
    out = []
    for row in rows:
        rec = dict(name=row.name)
        for what in ('fwd_bwd', 'fwd'):
            ts = row.times[what]
            med = statistics.median(ts) if ts else None
            bmed = (statistics.median(base.times[what])
                    if base.times[what] else None)
            rec[f'{what}_ms'] = None if med is None else med * 1e3
            rec[f'{what}_ms_all'] = [t * 1e3 for t in ts]
            rec[f'{what}_time_ratio'] = (None if med is None or not bmed else
                                         med / bmed)
            peak, bpeak = row.peak[what], base.peak[what]
            rec[f'{what}_peak_mb'] = None if peak is None else peak / 2**20
            rec[f'{what}_mem_ratio'] = (None if peak is None or not bpeak else
                                        peak / bpeak)
        out.append(rec)
    return out


def check_targets(layer: List[dict]) -> Dict[str, dict]:
    """The issue's targets on the layer rows of one grid."""
    by = {r['name']: r for r in layer}
    res = {}
    ctx = by.get('mmpe ctx product k')
    if ctx and ctx['fwd_bwd_time_ratio'] is not None:
        res['ctx_product_k_time'] = dict(
            value=ctx['fwd_bwd_time_ratio'],
            limit=TARGETS['ctx_product_k_time'],
            met=ctx['fwd_bwd_time_ratio'] <= TARGETS['ctx_product_k_time'])
    if ctx and ctx['fwd_bwd_mem_ratio'] is not None:
        res['ctx_product_k_memory'] = dict(
            value=ctx['fwd_bwd_mem_ratio'],
            limit=TARGETS['ctx_product_k_memory'],
            met=ctx['fwd_bwd_mem_ratio'] <= TARGETS['ctx_product_k_memory'])
    bias = [
        r for n, r in by.items()
        if n.startswith('mmpe bias') and not n.endswith(')')
        and r['fwd_bwd_time_ratio'] is not None
    ]
    if bias:
        worst = max(bias, key=lambda r: r['fwd_bwd_time_ratio'])
        res['bias_time'] = dict(
            value=worst['fwd_bwd_time_ratio'],
            worst=worst['name'],
            limit=TARGETS['bias_time'],
            met=worst['fwd_bwd_time_ratio'] <= TARGETS['bias_time'])
    eq = by.get(EQ27)
    if ctx and eq and ctx['fwd_bwd_ms'] and eq['fwd_bwd_ms']:
        speedup = eq['fwd_bwd_ms'] / ctx['fwd_bwd_ms']
        res['eq27_speedup'] = dict(
            value=speedup,
            limit=TARGETS['eq27_speedup'],
            met=speedup >= TARGETS['eq27_speedup'])
    return res


def softmax_ab(layer: List[dict]) -> Dict[str, dict]:
    """Item 5 of issue 11: fwd+bwd time of each plain-softmax row over the
    in-place softmax row, and whether the private ATen calls earn their
    place (every plain variant at least ``SOFTMAX_KEEP`` times slower)."""
    by = {r['name']: r for r in layer}
    a = by.get(SOFTMAX_A)
    if not a or not a['fwd_bwd_ms']:
        return {}
    res = {}
    for name in SOFTMAX_B:
        b = by.get(name)
        if b and b['fwd_bwd_ms']:
            # per-round ratios too: the rounds are interleaved, so each
            # pair saw the same background load
            pairs = zip(b['fwd_bwd_ms_all'], a['fwd_bwd_ms_all'])
            res[name] = dict(
                in_place_ms=a['fwd_bwd_ms'],
                plain_ms=b['fwd_bwd_ms'],
                ratio=b['fwd_bwd_ms'] / a['fwd_bwd_ms'],
                round_ratios=[pb / pa for pb, pa in pairs],
                in_place_peak_mb=a['fwd_bwd_peak_mb'],
                plain_peak_mb=b['fwd_bwd_peak_mb'])
    if res:
        res['keep_private_aten'] = all(r['ratio'] >= SOFTMAX_KEEP
                                       for r in res.values())
    return res


def _fmt(v: Optional[float], spec: str) -> str:
    return '-' if v is None else format(v, spec)


def print_table(title: str, recs: List[dict]) -> None:
    print(f'\n{title}')
    head = (f'{"row":<40}{"fwd+bwd ms":>11}{"x":>6}{"fwd ms":>9}{"x":>6}'
            f'{"peak MB":>9}{"x":>6}{"fwd MB":>8}{"x":>6}')
    print(head)
    print('-' * len(head))
    for r in recs:
        print(f'{r["name"]:<40}'
              f'{_fmt(r["fwd_bwd_ms"], ".1f"):>11}'
              f'{_fmt(r["fwd_bwd_time_ratio"], ".2f"):>6}'
              f'{_fmt(r["fwd_ms"], ".1f"):>9}'
              f'{_fmt(r["fwd_time_ratio"], ".2f"):>6}'
              f'{_fmt(r["fwd_bwd_peak_mb"], ".0f"):>9}'
              f'{_fmt(r["fwd_bwd_mem_ratio"], ".2f"):>6}'
              f'{_fmt(r["fwd_peak_mb"], ".0f"):>8}'
              f'{_fmt(r["fwd_mem_ratio"], ".2f"):>6}')



# ---------------------------------------------------------------------------
# long sequences: iRPE against the fused no-RPE path at L = 1050 ... 8192
# ---------------------------------------------------------------------------
#: token grids of the long-sequence rows (L = h * w): a DETR grid, a
#: 1024 x 1024 image at stride 16, a 1024 x 2048 one
LONG_GRIDS = {1050: (25, 42), 4096: (64, 64), 8192: (64, 128)}
#: head configurations: (embed_dims, num_heads, layout)
HEAD_CFGS = {'vit-s': (384, 6, 'timm'), 'detr': (256, 8, 'mmcv')}
LONG_BASE = 'mmpe no RPE'
LONG_CTX = 'mmpe ctx product k'
#: variant -> PEAttention arguments (None: no RPE, the fused SDPA path);
#: names without a backend use the default attn_impl ('auto')
LONG_VARIANTS = {
    LONG_BASE: None,
    LONG_CTX: dict(mode='contextual', rpe_on='k'),
    'mmpe ctx product k (explicit)': dict(
        mode='contextual', rpe_on='k', attn_impl='explicit'),
    'mmpe ctx product k (chunked)': dict(
        mode='contextual', rpe_on='k', attn_impl='chunked'),
    'mmpe bias product k': dict(mode='bias', rpe_on='k'),
    'mmpe ctx product qkv': dict(mode='contextual', rpe_on='qkv'),
    # ViTDet's decomposed relative position, tables for the row's grid (the
    # ViT layout only: the DETR encoders have no such choice)
    'mmpe rel-pos': dict(rel_pos=True),
}
LONG_MODES = ('eager', 'compiled')
#: aims (fwd+bwd, x the fused no-RPE row of the same mode, dtype and run),
#: at every length: time (wall and process CPU time, both) and tensor peak
LONG_AIMS = dict(time=1.25, memory=1.3)


class LongCall(nn.Module):
    """One attention layer over the tokens of a feature map.

    ``forward(feat, mask)``: ``feat`` (B, C, h, w), ``mask`` (B, h, w) bool
    (True = padding) -> (B, h * w, C); the grid is read from the map's
    shape, so under ``torch.compile(dynamic=True)`` it is symbolic. The
    timm layout (:class:`ViTAttention`, the CPVT blocks) or mmcv's
    (:class:`iRPEMultiheadAttention`, the DETR encoders).
    """

    def __init__(self, module: nn.Module, layout: str) -> None:
        super().__init__()
        self.module, self.layout = module, layout

    def forward(self, feat: Tensor, mask: Tensor) -> Tensor:
        height, width = feat.shape[-2:]
        x = feat.flatten(2).transpose(1, 2)  # (B, C, h, w) -> (B, h*w, C)
        mask = mask.flatten(1)
        if self.layout == 'timm':
            return self.module(x, (height, width), key_padding_mask=mask)
        return self.module(x, key_padding_mask=mask,
                           spatial_shape=(height, width))


def long_module(variant: str, cfg: str, grid: Tuple[int, int]) -> LongCall:
    """The layer of a long-sequence row (seeded, Xavier iRPE tables; the
    decomposed relative position with truncated-normal tables made for
    ``grid``)."""
    from mmpe.models.layers import ViTAttention
    dims, heads, layout = HEAD_CFGS[cfg]
    spec = LONG_VARIANTS[variant]
    kwargs = {}
    if spec is not None and spec.get('rel_pos'):
        kwargs = dict(rel_pos_cfg=dict(input_size=tuple(grid),
                                       init='trunc_normal'))
    elif spec is not None:
        spec = dict(spec)
        kwargs = dict(rpe_on=spec.pop('rpe_on'),
                      attn_impl=spec.pop('attn_impl', 'auto'),
                      rpe_cfg=dict(_rpe_cfg('bias' if spec['mode'] == 'bias'
                                            else 'ctx', 'product')))
    torch.manual_seed(0)
    if layout == 'timm':
        module = ViTAttention(dims, heads, **kwargs)
    else:
        module = iRPEMultiheadAttention(dims, heads, batch_first=True,
                                        **kwargs)
    return LongCall(module, layout)


class LongInputs:
    """Feature map (B, C, h, w), its mask (B, h, w) and the output
    gradient (B, h * w, C); with B > 1 the last image is padded by
    ``pad`` at the bottom / right (as mmdet pads a batch)."""

    def __init__(self, batch: int, grid: Tuple[int, int], dims: int,
                 pad: float, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(0)
        h, w = grid
        self.grid = grid
        self.x = torch.randn(batch, dims, h, w, generator=gen).to(device)
        self.grad = torch.randn(batch, h * w, dims, generator=gen).to(device)
        mask = torch.zeros(batch, h, w, dtype=torch.bool)
        if batch > 1 and pad > 0:
            mask[-1, h - int(pad * h):] = True
            mask[-1, :, w - int(pad * w):] = True
        self.mask = mask.to(device)


def _long_call(m: nn.Module, x: Tensor, s: LongInputs) -> Tensor:
    return m(x, s.mask)


def long_batch(length: int, args: argparse.Namespace) -> int:
    """Batch of a length: ``--long-batch``, else 2 up to 2048 tokens (a
    DETR batch) and 1 above (one large image per step fits a CPU)."""
    if args.long_batch:
        return args.long_batch
    return 2 if length <= 2048 else 1


def long_rows(grid: Tuple[int, int], cfg: str, args: argparse.Namespace,
              device: torch.device) -> List[Row]:
    """Eager and compiled rows of every variant of one (grid, heads)."""
    length = grid[0] * grid[1]
    pattern = re.compile(args.variants) if args.variants else None
    rows = []
    for variant in LONG_VARIANTS:
        spec = LONG_VARIANTS[variant] or {}
        impl = spec.get('attn_impl')
        if variant not in (LONG_BASE, LONG_CTX) and pattern is not None \
                and not pattern.search(variant):
            continue
        if impl == 'explicit' and length > args.explicit_max_length:
            continue  # (B, H, L, L) buffers of GBs: opt-in
        if spec.get('rel_pos') and HEAD_CFGS[cfg][2] != 'timm':
            continue  # a ViT backbone's term; DETR encoders have none
        for mode in args.modes:
            call = long_module(variant, cfg, grid).to(device)
            module = call if mode == 'eager' else torch.compile(
                call, backend=args.backend, dynamic=True)
            row = Row(f'{variant} {mode}', module, _long_call, True, False)
            row.variant, row.mode = variant, mode
            rows.append(row)
    return rows


def _rss_kb(field: str) -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1])
    raise RuntimeError(f'{field} not in /proc/self/status')


def rss_peak(run: Callable[[], None]) -> Optional[float]:
    """Bytes by which the resident set's high-water mark rose during
    ``run()`` (Linux): free heap pages are returned first (``malloc_trim``)
    and the mark is reset (``/proc/self/clear_refs``), so every page the
    run touches counts, tensors or not (allocator caches, MKL buffers)."""
    import ctypes
    import gc
    try:
        gc.collect()
        ctypes.CDLL('libc.so.6').malloc_trim(0)
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')  # VmHWM := VmRSS
        base = _rss_kb('VmRSS')
    except OSError:
        return None
    run()
    return float(_rss_kb('VmHWM') - base) * 1024


def memory_row(spec: dict) -> dict:
    """Peak memory of one row's fwd+bwd, in this (fresh) process: the
    tensor peak (:func:`peak_memory`) and the RSS peak (:func:`rss_peak`),
    after two warm-up runs (compilation, caches)."""
    if spec.get('threads'):
        torch.set_num_threads(spec['threads'])
    device = torch.device(spec['device'])
    length = spec['length']
    grid = tuple(spec['grid'])
    dims = HEAD_CFGS[spec['cfg']][0]
    s = LongInputs(spec['batch'], grid, dims, spec['pad'], device)
    call = long_module(spec['variant'], spec['cfg'], grid).to(device)
    module = call if spec['mode'] == 'eager' else torch.compile(
        call, backend=spec['backend'], dynamic=True)
    row = Row(spec['variant'], module, _long_call, True, False)
    with torch.autocast(device.type, dtype=torch.bfloat16,
                        enabled=spec.get('amp', False)):
        for _ in range(2):
            _clear_grads(row)
            _run(row, s, 'fwd_bwd')
        _clear_grads(row)
        rss = None if device.type == 'cuda' else rss_peak(
            lambda: _run(row, s, 'fwd_bwd'))
        tensors = peak_memory(row, s, 'fwd_bwd', device)
    return dict(length=length, tensor_peak=tensors, rss_peak=rss)


def _memory_subprocess(spec: dict) -> dict:
    """:func:`memory_row` in a fresh interpreter (so that one row's pages
    and caches do not hide another's)."""
    import subprocess
    cmd = [sys.executable, os.path.abspath(__file__), '--long-memory-row',
           json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep +
                                   os.environ.get('PYTHONPATH', '')))
    for line in proc.stdout.splitlines():
        if line.startswith('MEMORY '):
            return json.loads(line[len('MEMORY '):])
    raise RuntimeError(f'memory row {spec} failed:\n{proc.stderr[-3000:]}')


def long_group(length: int, grid: Tuple[int, int], cfg: str,
               args: argparse.Namespace, device: torch.device) -> dict:
    """Time (interleaved rounds) and measure one (length, heads) group."""
    batch = long_batch(length, args)
    dims = HEAD_CFGS[cfg][0]
    s = LongInputs(batch, grid, dims, args.pad, device)
    rows = long_rows(grid, cfg, args, device)
    counters = torch._dynamo.utils.counters
    for row in rows:  # warm-up: compilation, plan caches
        counters.clear()
        row.first = time_once(row, s, 'fwd_bwd', device)
        row.graphs = int(counters['stats']['unique_graphs'])
        row.breaks = int(sum(counters['graph_break'].values()))
        if args.verbose:
            print(f'  {length} {cfg} {row.name}: first f+b {row.first:.1f} s',
                  flush=True)
    for row in rows:
        row.cpu = []
    for r in range(args.rounds):
        for row in rows:
            cpu0 = time.process_time()
            row.times['fwd_bwd'].append(time_once(row, s, 'fwd_bwd', device))
            row.cpu.append(time.process_time() - cpu0)
        if args.verbose:
            print(f'  round {r + 1}/{args.rounds} done', flush=True)
    if not args.no_memory:
        for row in rows:
            spec = dict(length=length, grid=list(grid), cfg=cfg,
                        variant=row.variant, mode=row.mode, batch=batch,
                        pad=args.pad, device=str(device),
                        backend=args.backend, amp=args.amp,
                        threads=torch.get_num_threads())
            mem = _memory_subprocess(spec)
            row.peak['fwd_bwd'] = mem['tensor_peak']
            row.rss = mem['rss_peak']
    recs = []
    for row in rows:
        ts = row.times['fwd_bwd']
        recs.append(dict(
            name=row.name, variant=row.variant, mode=row.mode,
            fwd_bwd_ms=statistics.median(ts) * 1e3,
            fwd_bwd_ms_all=[t * 1e3 for t in ts], first_s=row.first,
            cpu_ms=statistics.median(row.cpu) * 1e3,
            cpu_ms_all=[t * 1e3 for t in row.cpu],
            graphs=row.graphs, graph_breaks=row.breaks,
            peak_mb=(None if row.peak['fwd_bwd'] is None else
                     row.peak['fwd_bwd'] / 2**20),
            rss_mb=(None if getattr(row, 'rss', None) is None else
                    row.rss / 2**20)))
    by = {(r['variant'], r['mode']): r for r in recs}
    for r in recs:
        base = by.get((LONG_BASE, r['mode']))
        eager = by.get((r['variant'], 'eager'))
        r['x'] = r['fwd_bwd_ms'] / base['fwd_bwd_ms'] if base else None
        r['cpu_x'] = r['cpu_ms'] / base['cpu_ms'] if base else None
        # per round: rows are interleaved, each pair saw one background
        r['x_rounds'] = ([a / b for a, b in zip(r['fwd_bwd_ms_all'],
                                               base['fwd_bwd_ms_all'])]
                         if base else None)
        r['c_e'] = (r['fwd_bwd_ms'] / eager['fwd_bwd_ms']
                    if r['mode'] == 'compiled' and eager else None)
        r['cpu_c_e'] = (r['cpu_ms'] / eager['cpu_ms']
                        if r['mode'] == 'compiled' and eager else None)
        r['c_e_rounds'] = (
            [a / b for a, b in zip(r['fwd_bwd_ms_all'],
                                   eager['fwd_bwd_ms_all'])]
            if r['mode'] == 'compiled' and eager else None)
        for key in ('peak_mb', 'rss_mb'):
            ok = base and r[key] is not None and base[key]
            r[key.replace('_mb', '_x')] = r[key] / base[key] if ok else None
    return dict(length=length, grid=list(grid), cfg=cfg, batch=batch,
                rows=recs)


def long_aims(groups: List[dict]) -> List[dict]:
    """The aims on the default contextual-product-on-keys row (eager): time
    (met when both the wall-time and the process CPU-time ratio are within
    it: waiting for a core on a busy machine inflates only the first) and
    tensor peak; and compiled < eager for every iRPE row."""
    out = []
    for g in groups:
        by = {(r['variant'], r['mode']): r for r in g['rows']}
        ctx = by.get((LONG_CTX, 'eager'))
        tag = f"L={g['length']} {g['cfg']}"
        if ctx is not None:
            cpu = ctx.get('cpu_x')
            worst = max(ctx['x'], cpu if cpu is not None else ctx['x'])
            out.append(dict(aim=f'{tag} time <= {LONG_AIMS["time"]}x',
                            value=ctx['x'], cpu_value=cpu,
                            met=worst <= LONG_AIMS['time']))
            if ctx['peak_x'] is not None:
                out.append(dict(
                    aim=f'{tag} peak memory <= {LONG_AIMS["memory"]}x',
                    value=ctx['peak_x'],
                    met=ctx['peak_x'] <= LONG_AIMS['memory']))
        for r in g['rows']:
            if r['c_e'] is not None and r['variant'] != LONG_BASE:
                out.append(dict(aim=f'{tag} {r["variant"]} compiled < eager',
                                value=r['c_e'], met=r['c_e'] < 1))
    return out


def print_long(g: dict) -> None:
    print(f"\nL = {g['length']} ({g['grid'][0]}x{g['grid'][1]}), {g['cfg']} "
          f"({HEAD_CFGS[g['cfg']][1]} heads x "
          f"{HEAD_CFGS[g['cfg']][0] // HEAD_CFGS[g['cfg']][1]}), batch "
          f"{g['batch']}; x = / '{LONG_BASE}' of the same mode")
    head = (f'{"row":<38}{"f+b ms":>9}{"x":>6}{"c/e":>6}{"cpu x":>6}'
            f'{"cpu c/e":>8}{"peak MB":>8}{"x":>6}{"RSS MB":>8}{"x":>6}'
            f'{"1st s":>7}{"brk":>4}')
    print(head)
    print('-' * len(head))
    for r in g['rows']:
        print(f'{r["name"]:<38}{_fmt(r["fwd_bwd_ms"], ".0f"):>9}'
              f'{_fmt(r["x"], ".2f"):>6}{_fmt(r["c_e"], ".2f"):>6}'
              f'{_fmt(r["cpu_x"], ".2f"):>6}{_fmt(r["cpu_c_e"], ".2f"):>8}'
              f'{_fmt(r["peak_mb"], ".0f"):>8}{_fmt(r["peak_x"], ".2f"):>6}'
              f'{_fmt(r["rss_mb"], ".0f"):>8}{_fmt(r["rss_x"], ".2f"):>6}'
              f'{r["first_s"]:>7.1f}{r["graph_breaks"]:>4}')


def long_main(args: argparse.Namespace) -> dict:
    """The long-sequence benchmark (``--long``)."""
    device = benchmark_device(args)
    load = os.getloadavg() if hasattr(os, 'getloadavg') else None
    torch._dynamo.config.recompile_limit = 64
    results = dict(env=dict(
        date=datetime.now(timezone.utc).isoformat(timespec='seconds'),
        torch=torch.__version__, device=str(device),
        device_name=platform.processor() or platform.machine(),
        cpu_count=os.cpu_count(), threads=torch.get_num_threads(),
        load_avg_start=load), args={
            k: v for k, v in vars(args).items() if k != 'grids'
        }, groups=[])
    print(f'torch {torch.__version__} on {device}, '
          f'{torch.get_num_threads()} threads, load average {load}; median '
          f'of {args.rounds} interleaved rounds'
          + ('; bf16 autocast' if args.amp else ''))
    grids = args.long_grids or [LONG_GRIDS[n] for n in args.lengths]
    for grid in grids:
        length = grid[0] * grid[1]
        for cfg in args.head_cfgs:
            with warnings.catch_warnings(), torch.autocast(
                    device.type, dtype=torch.bfloat16, enabled=args.amp):
                warnings.simplefilter('ignore')
                g = long_group(length, grid, cfg, args, device)
            results['groups'].append(g)
            print_long(g)
            if args.out:  # partial results survive an interruption
                _write_json(results, args.out)
    results['aims'] = long_aims(results['groups'])
    print('\naims:')
    for a in results['aims']:
        cpu = (f" (CPU time {a['cpu_value']:.2f})"
               if a.get('cpu_value') is not None else '')
        print(f"  {a['aim']}: {a['value']:.2f}{cpu} "
              f"{'met' if a['met'] else 'NOT met'}")
    results['env']['load_avg_end'] = (os.getloadavg() if hasattr(
        os, 'getloadavg') else None)
    if args.out:
        _write_json(results, args.out)
        print(f'\nwrote {args.out}')
    return results


def _write_json(results: dict, out: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, 'w') as f:
        json.dump(results, f, indent=1)

def _grid(text: str) -> Tuple[int, int]:
    m = re.fullmatch(r'(\d+)x(\d+)', text)
    if not m:
        raise argparse.ArgumentTypeError(
            f'grid {text!r} must look like 25x42 (height x width)')
    return int(m.group(1)), int(m.group(2))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--grids', nargs='+', type=_grid, default=[(25, 42)],
        help='feature grids HxW (DETR: 13x21, 25x42, 50x84)')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--dims', type=int, default=256)
    parser.add_argument('--heads', type=int, default=8)
    parser.add_argument(
        '--pad', type=float, default=0.1,
        help='fraction of rows and of columns padded in the last image')
    parser.add_argument('--dropout', type=float, default=0.0,
                        help='attention / FFN dropout (training passes)')
    parser.add_argument('--rounds', type=int, default=7,
                        help='interleaved timed rounds (median reported)')
    parser.add_argument('--device', default='cpu',
                        help="'cpu', 'cuda' or 'auto' (cuda if present)")
    parser.add_argument('--threads', type=int, default=None,
                        help='torch.set_num_threads (default: unchanged)')
    parser.add_argument(
        '--variants', default=None,
        help='regex: only rows whose name matches (the baseline is always '
        'kept)')
    parser.add_argument('--passes', nargs='+', default=['fwd_bwd', 'fwd'],
                        choices=['fwd_bwd', 'fwd'])
    parser.add_argument('--no-encoder', action='store_true',
                        help='skip the 6-layer encoder rows')
    parser.add_argument('--encoder-layers', type=int, default=6)
    parser.add_argument('--no-memory', action='store_true',
                        help='skip the peak-memory runs')
    parser.add_argument('--no-flex', action='store_true',
                        help='skip the FlexAttention rows')
    parser.add_argument(
        '--quick', action='store_true',
        help='small and fast (tests): 6x8 grid, batch 2, 64 dims, 4 heads, '
        '2 rounds, 2-layer encoder, a few rows, no flex')
    parser.add_argument(
        '--profile', default=None, metavar='REGEX',
        help='also profile (torch.profiler) the fwd+bwd of matching rows')
    parser.add_argument('--out', help='write the results as JSON here')
    parser.add_argument('--verbose', action='store_true')
    group = parser.add_argument_group(
        'long sequences (--long): one layer, fused no-RPE path against iRPE')
    group.add_argument('--long', action='store_true',
                       help='run the long-sequence benchmark instead')
    group.add_argument('--lengths', nargs='+', type=int,
                       default=[1050, 4096, 8192],
                       choices=sorted(LONG_GRIDS),
                       help='token counts (grids: 25x42, 64x64, 64x128)')
    group.add_argument('--long-grids', nargs='+', type=_grid, default=None,
                       help='grids HxW instead of --lengths')
    group.add_argument('--head-cfgs', nargs='+', default=list(HEAD_CFGS),
                       choices=list(HEAD_CFGS),
                       help='vit-s: 384 dims, 6 heads (timm layout); '
                       'detr: 256 dims, 8 heads (mmcv layout)')
    group.add_argument('--long-batch', type=int, default=None,
                       help='batch of every length (default: 2 up to 2048 '
                       'tokens, 1 above)')
    group.add_argument('--modes', nargs='+', default=list(LONG_MODES),
                       choices=list(LONG_MODES))
    group.add_argument('--backend', default='inductor',
                       help='torch.compile backend of the compiled rows')
    group.add_argument('--explicit-max-length', type=int, default=4096,
                       help='longest L with the explicit row (its (B, H, L, '
                       'L) buffers: 1.6 GB each at 8192, ViT-S, batch 1)')
    group.add_argument('--amp', action='store_true',
                       help='run every row under bf16 autocast (as '
                       'tools/train.py --amp does on CPU)')
    group.add_argument('--long-memory-row', default=None,
                       help=argparse.SUPPRESS)  # internal: one memory row
    args = parser.parse_args(argv)
    if args.quick:
        args.grids, args.dims, args.heads = [(6, 8)], 64, 4
        args.rounds, args.encoder_layers, args.no_flex = 2, 2, True
        if args.variants is None:
            args.variants = ('no RPE|ctx product k|bias product k$|'
                             r'bias product k \(sdpa\)|Eq|encoder')
    return args


def benchmark_device(args: argparse.Namespace) -> torch.device:
    """Set ``--threads`` (if given) and resolve ``--device`` ('auto': CUDA
    when available, else CPU); shared by the benchmark scripts."""
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    if dev == 'auto':
        dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    return torch.device(dev)


def main(argv: Optional[List[str]] = None) -> dict:
    args = parse_args(argv)
    if args.long_memory_row:
        print('MEMORY ' + json.dumps(memory_row(json.loads(
            args.long_memory_row))), flush=True)
        return {}
    if args.long:
        return long_main(args)
    device = benchmark_device(args)
    flex_ok = {
        'fwd_bwd':
        not args.no_flex and flex_unsupported_reason(device, True) is None,
        'fwd':
        not args.no_flex and flex_unsupported_reason(device, False) is None
    }
    load = os.getloadavg() if hasattr(os, 'getloadavg') else None
    env = dict(
        date=datetime.now(timezone.utc).isoformat(timespec='seconds'),
        torch=torch.__version__,
        device=str(device),
        device_name=(torch.cuda.get_device_name(device)
                     if device.type == 'cuda' else platform.processor()
                     or platform.machine()),
        cpu_count=os.cpu_count(),
        threads=torch.get_num_threads(),
        load_avg_start=load,
        flex=flex_ok,
        # allocator knobs that change CPU timings (page faults of fresh
        # (B, H, L, L) buffers)
        env_vars={
            k: os.environ.get(k)
            for k in ('OMP_NUM_THREADS', 'THP_MEM_ALLOC_ENABLE',
                      'LD_PRELOAD')
        })
    print(f'torch {env["torch"]} on {env["device"]} ({env["device_name"]}), '
          f'{env["threads"]} threads, load average {load}; batch '
          f'{args.batch}, {args.dims} dims, {args.heads} heads; median of '
          f'{args.rounds} interleaved rounds; x = ratio to {BASELINE!r} of '
          'the same run')
    results = dict(env=env, args={
        k: (v if k != 'grids' else [f'{h}x{w}' for h, w in v])
        for k, v in vars(args).items()
    }, grids={})
    pattern = re.compile(args.variants) if args.variants else None
    for grid in args.grids:
        key = f'{grid[0]}x{grid[1]}'
        inputs = Inputs(args.batch, grid, args.dims, args.pad, device)
        res = {}
        groups = [('layer', layer_rows)]
        if not args.no_encoder:
            groups.append(('encoder', encoder_rows))
        for group, build in groups:
            rows = build(args, device, flex_ok)
            base = rows[0].name
            if pattern is not None:
                rows = [
                    r for r in rows if r.name == base or pattern.search(r.name)
                ]
            if args.no_flex:
                rows = [r for r in rows if '(flex)' not in r.name]
            if args.verbose:
                print(f'{key} {group}: {len(rows)} rows', flush=True)
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')
                measure(rows, inputs, args, device)
            recs = summarise(rows, base)
            res[group] = recs
            print_table(
                f'{group} @ {key} (L = {grid[0] * grid[1]}, '
                f'{args.encoder_layers if group == "encoder" else 1} '
                'layer(s))', recs)
            if args.profile:
                res[f'{group}_profile'] = profile_rows(
                    rows, inputs, args.profile, device)
            del rows
        res['targets'] = check_targets(res['layer'])
        res['softmax_ab'] = softmax_ab(res['layer'])
        results['grids'][key] = res
        if res['targets']:
            print('\ntargets (layer, fwd+bwd):')
            for name, t in res['targets'].items():
                print(f'  {name}: {t["value"]:.2f} (limit {t["limit"]}) '
                      f'{"met" if t["met"] else "NOT met"}')
        if res['softmax_ab']:
            print('\nsoftmax A/B (layer, fwd+bwd, plain / in-place private '
                  f'ATen; keep the private calls if >= {SOFTMAX_KEEP}):')
            for name, t in res['softmax_ab'].items():
                if name != 'keep_private_aten':
                    print(f'  {name}: {t["plain_ms"]:.1f} / '
                          f'{t["in_place_ms"]:.1f} ms = {t["ratio"]:.2f}')
            print(f'  keep private ATen calls: '
                  f'{res["softmax_ab"]["keep_private_aten"]}')
    env['load_avg_end'] = (os.getloadavg()
                           if hasattr(os, 'getloadavg') else None)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(results, f, indent=1)
        print(f'\nwrote {args.out}')
    return results


if __name__ == '__main__':
    main()
