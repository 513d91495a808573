"""The rows of the attention benchmark (``attention.py``): mmcv's
``MultiheadAttention`` (the baseline), mmpe's attention with every iRPE
mode, method and placement and every backend, the paper's Eq. 27-28 as
written (:class:`Eq27Attention`), the plain-softmax variants of the softmax
A/B (:func:`plain_softmax`), the offset biases (log-CPB, 2D ALiBi,
LookHere) beside an iRPE product bias (:func:`offset_bias_rows`), and the
same backends in a DETR encoder."""
import argparse
import contextlib
import math
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from bench_measure import Row
from mmcv.cnn.bricks.transformer import MultiheadAttention
from mmdet.models.layers import DetrTransformerEncoder
from torch import Tensor

from mmpe.models.detectors import iRPEDetrTransformerEncoder
from mmpe.models.layers import iRPEMultiheadAttention
from mmpe.models.layers.attention import ops as attention_ops

BASELINE = 'mmcv MHA'
EQ27 = 'Eq.27-28 ctx product k'
# the softmax A/B of issue 11 item 5: in-place private-ATen softmax (A)
# against public torch.softmax (B)
SOFTMAX_A = 'mmpe ctx product k'
SOFTMAX_B = ('mmpe ctx product k (plain softmax)',
             'mmpe ctx product k (plain softmax, add_)')
MODES = {'bias': ('k', 'qk'), 'ctx': ('k', 'qk', 'qkv')}
METHODS = ('product', 'cross', 'euclidean', 'quant')
#: the offset biases' rows: name -> ``bias_cfg``
OFFSET_BIASES = {
    'log-cpb': dict(type='log-cpb', pretrained_size=(25, 42)),
    'alibi-2d': dict(type='alibi-2d'),
    'lookhere': dict(type='lookhere', directions='corners'),
}


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

    def backend_rows(impl, modes, backward, forward):
        """Product-method rows on k and qk of one backend."""
        for mode in modes:
            for on in ('k', 'qk'):
                m = iRPEMultiheadAttention(
                    dims, heads, rpe_cfg=_rpe_cfg(mode, 'product'),
                    rpe_on=on, attn_impl=impl, **common)
                rows.append((f'mmpe {mode} product {on} ({impl})', m,
                             irpe_call, backward, forward))

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
    backend_rows('sdpa', ('bias', 'ctx'), True, True)
    rows.append((EQ27,
                 Eq27Attention(dims, heads,
                               rpe_cfg=_rpe_cfg('ctx', 'product'),
                               rpe_on='k', **common), irpe_call, True, True))
    backend_rows('flex', ('ctx', 'bias'), flex_ok['fwd_bwd'], flex_ok['fwd'])
    rows += offset_bias_rows(args, irpe_call)
    return [Row(n, m.to(device), c, b, f) for n, m, c, b, f in rows]


def offset_bias_rows(args: argparse.Namespace, call) -> List[tuple]:
    """The terms whose values are one per-head table shared by every query
    (the broadcast terms), through each backend that takes them:
    ``mmpe {log-cpb,alibi-2d,lookhere} ({explicit,fused,auto})``, the
    offset biases, a per-head table of ``(2h-1)(2w-1)`` buckets in the
    product layout; ``mmpe bias product k clip-grid (...)``, iRPE's bias of
    the product method with a clip distance ``k`` of the largest side of
    ``--grids`` minus 1 (per-head tables, ``(2k+1)^2`` buckets): the same
    product-layout path of the same backend, the comparison of issue 47;
    and ``mmpe bias product k ({explicit,fused})``, iRPE's bias with its
    piecewise index (the ``mmpe bias product k`` row's setting)."""
    dims, heads = args.dims, args.heads
    common = layer_kwargs(args)
    side = max(max(grid) for grid in args.grids) - 1
    clip = dict(mode='bias', method='product', index='clip',
                max_distance=side, shared_head=False, init='xavier')
    irpe = {'clip-grid ': clip, '': _rpe_cfg('bias', 'product')}
    rows = []
    for impl in ('explicit', 'fused', 'auto'):
        for name, rpe in irpe.items() if impl != 'auto' else ():
            rows.append((f'mmpe bias product k {name}({impl})',
                         iRPEMultiheadAttention(dims, heads, rpe_cfg=rpe,
                                                rpe_on='k', attn_impl=impl,
                                                **common), call, True, True))
        for name, cfg in OFFSET_BIASES.items():
            rows.append((f'mmpe {name} ({impl})',
                         iRPEMultiheadAttention(dims, heads, bias_cfg=cfg,
                                                attn_impl=impl, **common),
                         call, True, True))
    return rows


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
