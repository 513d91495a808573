"""Image relative position encoding (iRPE) of queries, keys or values.

Implements the bias and contextual modes (Eq. 13-17) of `Rethinking and
Improving Relative Position Encoding for Vision Transformer
<https://arxiv.org/abs/2107.14222>`_ (Wu et al., ICCV 2021): a thin module
holding the encoding table; the (L, L) expansion of Eq. 26-28 is done by the
plans of :mod:`~mmpe.models.layers.irpe.plans`, bucket ids come from
:mod:`~mmpe.models.layers.irpe.index`.
"""
import json
import math
from typing import Optional, Union

import torch
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor, nn

from ....utils.arg_checks import check_int
from ..common.arg_checks import check_choice, check_grid
from ..common.cache import CacheInfo
from .buckets import get_bucket_ids_2d
from .index import (INDEX_FUNCS, METHODS, BucketSpec, get_num_buckets,
                    max_index, num_buckets_per_table)
from .plan_cache import PLAN_CACHE
from .terms import IRPETerm, bucket_lookup

@MODELS.register_module()
class iRPE(BaseModule):
    """Image relative position encoding on queries, keys or values.

    For a grid of ``height x width`` tokens after ``skip`` leading tokens
    (``L = skip + height * width``), every (query i, key j) pair has a bucket
    ``b(i, j)`` (see
    :func:`~mmpe.models.layers.irpe.buckets.get_bucket_ids_2d`) and the module returns the term it contributes to attention:

    * ``on='k'`` (Eq. 16, ``r^K``): ``x`` are the queries,
      ``out[i, j] = x_i . r_b(i, j)`` (contextual) or ``r_b(i, j)`` (bias),
      added to the logit of query ``i`` and key ``j``.
    * ``on='q'`` (``r^Q``): ``x`` are the keys,
      ``out[i, j] = x_j . r_b(j, i)`` (bias: ``r_b(j, i)``), added to the
      logit of query ``i`` and key ``j``. The bucket is taken from the key's
      point of view, ``b(j, i)`` (relative position key minus query), exactly
      as the authors' release computes ``rpe_q(k).transpose(-2, -1)``; for
      the undirected euclidean / quant methods and skip pairs
      ``b(j, i) = b(i, j)``, for product / cross it is the mirrored bucket.
    * ``on='v'`` (Eq. 17, contextual only): ``x`` are the attention
      probabilities, ``out[i] = sum_j x_ij r_b(i, j)``, added to the output of
      query ``i``.

    Contextual on q / k computes ``x @ table^T`` (B, H, L, num_buckets) and
    expands it to (L, L) (Eq. 27-28); on v it sums the attention per bucket
    (B, H, L, num_buckets) and multiplies by the table; no
    ``(L, L, head_dim)`` tensor is formed. For the product method the
    expansion is a pair of batched one-hot matmuls (the bucket factorises
    into a row part and a column part), for cross two per-axis gathers and a
    broadcast add, for euclidean / quant a gather. Bias mode does not depend
    on ``x`` beyond its dtype and device and returns a (1, H, L, L) term.

    Args:
        head_dim (int): Channels per head.
        num_heads (int): Number of attention heads.
        mode (str): 'bias' or 'contextual'. Defaults to 'contextual'.
        method (str): 'euclidean', 'quant', 'cross' or 'product'. Defaults
            to 'product'.
        on (str): 'q', 'k' or 'v' (bias: 'q' or 'k'). Defaults to 'k'.
        index (str): 'piecewise' (Eq. 18) or 'clip' (Shaw et al.). Defaults
            to 'piecewise'.
        ratio (float): ``alpha`` of the piecewise function, with
            ``alpha : beta : gamma = 1 : 2 : 8``; 1.9 gives 7 x 7 product
            buckets, 2.0 gives 9 x 9. Defaults to 1.9.
        max_distance (int, optional): ``k`` of the clip function; required
            (and only allowed) with ``index='clip'``. Defaults to None.
        shared_head (bool): Share one table among the heads. Defaults to True.
        skip (int): Leading non-spatial tokens (e.g. a class token), all
            pairs involving them use one extra bucket. Defaults to 0.
        init (str): Initialisation of :attr:`table`: 'zeros' (the paper),
            'xavier' (``xavier_uniform_`` with the fans of the authors' table
            layout, which their DETR code ends up applying) or
            'trunc_normal' (std 0.02). Defaults to 'zeros'.
        init_cfg (dict or list[dict], optional): mmengine init config.
            Defaults to None.

    Attributes:
        bucket_spec (BucketSpec): ``method``, ``index``, ``ratio`` (as a
            float) and ``max_distance`` (also readable as attributes of
            those names).
        num_buckets (int): Rows of :attr:`table`; cross stacks the row-axis
            buckets then the column-axis buckets (each with its own skip
            bucket).
        table (nn.Parameter): Bias ``(H', num_buckets)``; contextual
            ``(H', num_buckets, head_dim)``; ``H' = 1`` if ``shared_head``
            else ``num_heads``. From the authors' release: contextual q / k
            ``lookup_table_weight`` (H', head_dim, nb) is ``table``
            transposed (1, 2); v ``lookup_table_weight`` (H', nb, head_dim)
            and ``lookup_table_bias`` (H', nb) are ``table`` as is; cross
            concatenates ``rp_rows`` then ``rp_cols`` along the buckets.
    """

    MODES = ('bias', 'contextual')
    METHODS = METHODS
    ONS = ('q', 'k', 'v')
    INDEX_FUNCS = INDEX_FUNCS
    INITS = ('zeros', 'xavier', 'trunc_normal')

    def __init__(self,
                 head_dim: int,
                 num_heads: int,
                 mode: str = 'contextual',
                 method: str = 'product',
                 on: str = 'k',
                 index: str = 'piecewise',
                 ratio: float = 1.9,
                 max_distance: Optional[int] = None,
                 shared_head: bool = True,
                 skip: int = 0,
                 init: str = 'zeros',
                 init_cfg: Optional[Union[dict, list]] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        check_int('head_dim', head_dim)
        check_int('num_heads', num_heads)
        check_choice('mode', mode, self.MODES)
        check_choice('method', method, self.METHODS)
        check_choice('on', on, self.ONS)
        check_choice('index', index, self.INDEX_FUNCS)
        check_choice('init', init, self.INITS)
        if mode == 'bias' and on == 'v':
            raise ValueError(
                "Unsupported `on` 'v' with `mode` 'bias' (a bias on values "
                "is not defined), please choose `on` from ('q', 'k') or "
                "`mode` 'contextual'")
        if (isinstance(ratio, bool) or not isinstance(ratio, (int, float))
                or not math.isfinite(ratio) or ratio <= 0):
            raise ValueError(f'Unsupported `ratio` {ratio!r}, please choose '
                             'a finite number > 0 (e.g. 1.9 or 2.0)')
        if index == 'clip':
            check_int('max_distance', max_distance, hint="`index` 'clip'")
        elif max_distance is not None:
            raise ValueError(
                f'Unsupported `max_distance` {max_distance!r} with `index` '
                f"{index!r}, please choose None (it only applies to `index` "
                "'clip')")
        if not isinstance(shared_head, bool):
            raise ValueError(f'Unsupported `shared_head` {shared_head!r}, '
                             'please choose from (True, False)')
        check_int('skip', skip, minimum=0)

        self.head_dim = head_dim
        self.num_heads = num_heads
        self.mode = mode
        self.on = on
        self.bucket_spec = BucketSpec(method, index, float(ratio),
                                      max_distance)
        self.shared_head = shared_head
        self.skip = skip
        self.init = init
        self.num_buckets = get_num_buckets(self.bucket_spec, skip)
        # sizes derived from `ratio`, fixed here as ints: a traced forward
        # (torch.compile with dynamic=True) sees module floats as symbols
        self._side = 2 * max_index(self.bucket_spec) + 1
        per = num_buckets_per_table(self.bucket_spec, skip)
        spatial = per - int(skip > 0)
        self._slices = ((slice(0, spatial), slice(per, per + spatial))
                        if method == 'cross' else (slice(0, spatial), ))
        self._extras = (per - 1, 2 * per - 1) if method == 'cross' else (
            per - 1, )
        heads = 1 if shared_head else num_heads
        shape = (heads, self.num_buckets)
        if mode == 'contextual':
            shape += (head_dim, )
        self.table = nn.Parameter(torch.zeros(shape))
        self.reset_table()
        # the term's configuration, fixed here (a traced forward cannot
        # serialise it)
        self._term_spec = dict(
            mode=mode, method=method, on=on, index=index, ratio=float(ratio),
            max_distance=max_distance, skip=skip, shared_head=shared_head,
            side=self._side, num_heads=num_heads,
            num_buckets=self.num_buckets,
            slices=[[s.start, s.stop] for s in self._slices],
            extras=list(self._extras))
        self._term_spec_json = json.dumps(self._term_spec, sort_keys=True)

    # the bucket parameters, as given (one copy: :attr:`bucket_spec`)
    @property
    def method(self) -> str:
        return self.bucket_spec.method

    @property
    def index(self) -> str:
        return self.bucket_spec.index

    @property
    def ratio(self) -> float:
        return self.bucket_spec.ratio

    @property
    def max_distance(self) -> Optional[int]:
        return self.bucket_spec.max_distance

    # ------------------------------------------------------------------
    # initialisation
    # ------------------------------------------------------------------
    @torch.no_grad()
    def reset_table(self) -> None:
        """(Re-)initialise :attr:`table` according to ``init``."""
        if self.init == 'zeros':
            self.table.zero_()
        elif self.init == 'trunc_normal':
            nn.init.trunc_normal_(self.table, std=0.02)
        else:
            # the authors' layout: bias (H', nb), q / k (H', head_dim, nb),
            # v (H', nb, head_dim); xavier there, then into ours
            t = self.table
            if self.mode == 'contextual' and self.on != 'v':
                t = t.transpose(1, 2)
            tmp = torch.empty(t.shape, dtype=t.dtype, device=t.device)
            nn.init.xavier_uniform_(tmp)
            t.copy_(tmp)

    def init_weights(self) -> None:
        """Apply ``init`` then any ``init_cfg`` (mmengine convention)."""
        self.reset_table()
        super().init_weights()

    # ------------------------------------------------------------------
    # bucket ids and the plan cache
    # ------------------------------------------------------------------
    @staticmethod
    def cache_info() -> CacheInfo:
        """Hits, misses and size of the process-wide plan cache."""
        return PLAN_CACHE.info()

    @staticmethod
    def cache_clear() -> None:
        """Empty the plan cache and reset its counters."""
        PLAN_CACHE.clear()

    def bucket_ids(
            self,
            height: int,
            width: int,
            device: Optional[Union[str, torch.device]] = None) -> Tensor:
        """Bucket id of every (query, key) pair, an index into :attr:`table`.

        Args:
            height (int): Grid height.
            width (int): Grid width.
            device (str | torch.device, optional): Defaults to the table's.

        Returns:
            Tensor: Long (L, L), ``L = skip + height * width``, entry
            ``[i, j]`` for query ``i`` and key ``j``; cross: (2, L, L), the
            row-axis ids then the column-axis ids (offset past the row-axis
            buckets).
        """
        height, width = check_grid(height, width)
        device = self.table.device if device is None else device
        return get_bucket_ids_2d(height, width, self.bucket_spec, self.skip,
                                 device)

    # ------------------------------------------------------------------
    # forward
    # ------------------------------------------------------------------
    def forward(self,
                x: Tensor,
                height: int,
                width: int,
                logits: Optional[Tensor] = None) -> Tensor:
        """Compute the iRPE term.

        Args:
            x (Tensor): on 'k': queries (B, num_heads, L, head_dim); on 'q':
                keys (B, num_heads, L, head_dim); on 'v': attention
                probabilities (B, num_heads, L, L). Bias mode only uses its
                dtype and device. ``L = skip + height * width``.
            height (int): Grid height.
            width (int): Grid width.
            logits (Tensor, optional): on 'q' / 'k' only, attention logits
                (B, num_heads, L, L) to add the term to **in place**; they are
                returned. Saves the (B, num_heads, L, L) temporaries of
                ``logits + term`` (for contextual product on 'k' without skip
                tokens the term is never materialised). Autograd-safe: the
                logits must not be needed by another backward (true for the
                output of ``q @ k^T``). Defaults to None.

        Returns:
            Tensor: on 'q' / 'k': (B, num_heads, L, L) (bias: (1, num_heads,
            L, L)), the term added to the logit of query ``i`` and key ``j``,
            or ``logits`` plus the term if given; on 'v': (B, num_heads, L,
            head_dim). In the dtype of ``x`` (autocast may lower the matmuls).
        """
        height, width = check_grid(height, width)
        length = self.skip + height * width
        if x.dim() != 4:
            raise ValueError(f'iRPE expects a 4D input (B, num_heads, L, *), '
                             f'got shape {tuple(x.shape)}')
        if x.shape[2] != length:
            raise ValueError(
                f'iRPE input length {x.shape[2]} != skip + height * width = '
                f'{self.skip} + {height} * {width} = {length}')
        if x.shape[1] != self.num_heads:
            raise ValueError(f'iRPE input has {x.shape[1]} heads, expected '
                             f'num_heads = {self.num_heads}')
        last = length if self.on == 'v' else self.head_dim
        if self.mode == 'contextual' and x.shape[3] != last:
            raise ValueError(f'iRPE on {self.on!r} expects a last dim of '
                             f'{last}, got {x.shape[3]}')
        if logits is not None:
            shape = (x.shape[0], self.num_heads, length, length)
            if self.on == 'v' or tuple(logits.shape) != shape:
                raise ValueError(
                    f'iRPE `logits` must be (B, num_heads, L, L) = {shape} '
                    f"with `on` in ('q', 'k'), got shape "
                    f'{tuple(logits.shape)} and `on` {self.on!r}')
        term = self.term(x, height, width)
        if self.on == 'v':
            return term.out_rows(x, None)
        if logits is None:
            return term.dense()[0]
        return term.add_rows(logits, None)

    # ------------------------------------------------------------------
    # the term of one call (see terms.py)
    # ------------------------------------------------------------------
    def term_spec(self) -> dict:
        """The JSON-able configuration of :class:`IRPETerm`."""
        return self._term_spec

    def lookup(self, x: Tensor) -> Tensor:
        """Eq. 27's per-bucket lookup ``x @ table^T`` (contextual, q / k).

        Args:
            x (Tensor): Scaled queries (on 'k') or keys (on 'q'),
                (B, num_heads, L, head_dim).

        Returns:
            Tensor: (B, num_heads, L, num_buckets), in the dtype of ``x``.
        """
        return bucket_lookup(x, self.table.to(x.dtype), self.shared_head)

    def term(self, x: Tensor, height: int, width: int) -> IRPETerm:
        """This module's relative term of one attention call.

        Args:
            x (Tensor): As :meth:`forward` (bias mode: only its dtype and
                device are used).
            height (int): Grid height.
            width (int): Grid width.

        Returns:
            IRPETerm: Its tensors are ``x`` and the table (contextual q /
            k), or the table, in the dtype of ``x``.
        """
        tensors = [self.table.to(x.dtype)]
        if self.mode == 'contextual' and self.on != 'v':
            tensors.insert(0, x)
        return IRPETerm(self._term_spec, tensors, height, width,
                        self.skip + height * width, self._term_spec_json)
