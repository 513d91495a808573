"""mmpe's first Triton kernels (as of commit bf211de, before the compile
report), kept unchanged as the negative control of
tests/test_tools/test_kernel_report.py: their compiled code spills,
serialises the tensor-core pipeline (ptxas C7515), fences every atomic add
and runs about 3.5x the instructions per tile of the kernels without a
term. Not imported by mmpe.

The Triton kernels of the fused attention on CUDA (flash-attention form).

For scaled queries ``q`` (B, H, Q, d), keys ``k`` and values ``v``
(B, H, L, d) and at most one per-axis relative term on each of keys,
queries and values
(:class:`~mmpe.models.layers.terms.relative_term.AxisValues`), the forward
computes, one block of query rows per program and the keys in blocks,

.. math::

    e_{ij} = q_i k_j^T + c^K_i[b(i, j)] + c^Q_j[b(j, i)] + m_{ij}, \\quad
    o_i = \\sum_j p_{ij} v_j, \\quad s_{i\\beta} = \\sum_{j: b(i, j) =
    \\beta} p_{ij}

with the online softmax (running maximum and sum, float32), the row
log-sum-exp saved and the bucket sums ``s`` of the term on values (iRPE,
Wu et al. ICCV 2021, Eq. 16-17; the bucket ``b(i, j)`` of Eq. 18 / the
per-axis tables, as the CPU kernel reads it). The backward recomputes the
probabilities from the log-sum-exp: one kernel per block of keys
accumulates ``dk``, ``dv`` and the term on queries' gradient (rows owned
by the key block), one per block of queries ``dq`` and the term on keys'
gradient, with ``dE = P * (dP - delta)``, ``delta_i = dO_i . O_i +
ds_i . s_i``. Attention dropout (``HAS_DROPOUT``) multiplies ``P`` by a
mask scale drawn from Philox by (seed, batch-head, pair), the same in every
kernel, so nothing of it is stored. The bucket sums of ``P`` and ``dE`` are atomic adds into
float32 rows of the program's own tokens. No ``(L, L)`` tensor exists.

Pairs with one of the ``SKIP`` leading tokens (class tokens) read the
extra bucket(s) ``E0`` (+ ``E1``). With ``QGRID`` False the queries are not
grid tokens (a decoder's cross-attention): every query sees the keys from
the grid's origin, ``b(i, j) = (rows[0, jy], cols[0, jx])``.
"""
import triton
import triton.language as tl


@triton.jit
def _load_rows(X, b, h, s_b, s_h, s_l, offs, N, offs_d, D):
    """Rows ``offs`` (< ``N``) of head ``(b, h)`` of a (B, H, N, D) tensor
    with a contiguous last dim, zero-padded to the tile."""
    return tl.load(X + b * s_b + h * s_h + offs[:, None] * s_l +
                   offs_d[None, :],
                   mask=(offs[:, None] < N) & (offs_d[None, :] < D), other=0.)


@triton.jit
def _store_rows(X, val, b, h, s_b, s_h, s_l, offs, N, offs_d, D):
    """The counterpart of :func:`_load_rows` (in ``X``'s dtype)."""
    tl.store(X + b * s_b + h * s_h + offs[:, None] * s_l + offs_d[None, :],
             val.to(X.dtype.element_ty),
             mask=(offs[:, None] < N) & (offs_d[None, :] < D))


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """``a @ b`` accumulated in float32: IEEE float32 products, or the
    tensor cores' products of ``b``'s dtype (``a`` cast to it)."""
    if IEEE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32),
                      input_precision='ieee')
    return tl.dot(a.to(b.dtype), b)


@triton.jit
def _dropout_scale(SEED, P_DROP, pid_bh, offs_m, offs_n, LK):
    """Attention dropout of a tile: ``1 / (1 - p)`` where kept, 0 where
    dropped; one Philox stream per (batch, head) (key ``SEED + pid_bh``),
    the pair ``(i, j)`` at offset ``i * LK + j``: the forward and both
    backward kernels draw the same mask."""
    offsets = offs_m[:, None] * LK + offs_n[None, :]
    keep = tl.rand(SEED + pid_bh, offsets) >= P_DROP
    return tl.where(keep, 1.0 / (1.0 - P_DROP), 0.)


@triton.jit
def _grid_yx(t, SKIP, GW):
    """Grid row and column of tokens ``t`` (0 for leading tokens)."""
    g = tl.maximum(t - SKIP, 0)
    return g // GW, g % GW


@triton.jit
def _pairs(offs_m, offs_n, LQ, LK, SKIP, GW, QGRID: tl.constexpr):
    """The tile's pairs: ``(inside, skipped, iy, ix, jy, jx)``, (BM, BN)
    broadcastable: both tokens real, one of them a leading token, the grid
    positions of query and key (queries off the grid: the origin)."""
    i = offs_m[:, None]
    j = offs_n[None, :]
    jy, jx = _grid_yx(j, SKIP, GW)
    if QGRID:
        iy, ix = _grid_yx(i, SKIP, GW)
    else:
        iy = i * 0
        ix = i * 0
    return (i < LQ) & (j < LK), (i < SKIP) | (j < SKIP), iy, ix, jy, jx


@triton.jit
def _pair_buckets(vy, vx, oy, ox, skipped, inside, Rows, Cols, RS, CS, SX,
                  OFF, E0, E1, PRODUCT: tl.constexpr):
    """The bucket(s) of the viewer at ``(vy, vx)`` against the other token
    at ``(oy, ox)``: ``(first, second, use_second)``; product: ``u * SX +
    v`` alone, cross: ``u`` and ``OFF + v``; skipped pairs: ``E0`` (and
    ``E1`` where it is >= 0)."""
    on_grid = inside & (skipped == 0)
    u = tl.load(Rows + vy * RS + oy, mask=on_grid, other=0)
    v = tl.load(Cols + vx * CS + ox, mask=on_grid, other=0)
    if PRODUCT:
        first = tl.where(skipped, E0, u * SX + v)
        second = tl.zeros_like(first) + E1
        use_second = skipped & (second >= 0)
    else:
        first = tl.where(skipped, E0, u)
        second = tl.where(skipped, E1, OFF + v)
        use_second = second >= 0  # off the grid: always
    return first, second, use_second & inside


@triton.jit
def _logit_tile(q, k, offs_m, offs_n, b, h, Mask, VK, VQ, Rows, Cols,
                sm_b, sm_h, sm_i, sm_j, svk_b, svk_h, svk_l, svq_b, svq_h,
                svq_l, LQ, LK, SKIP, GW, RS, CS, SX, OFF, E0, E1,
                HAS_MASK: tl.constexpr, HAS_K: tl.constexpr,
                HAS_Q: tl.constexpr, PRODUCT: tl.constexpr,
                QGRID: tl.constexpr, IEEE: tl.constexpr):
    """The float32 logits (BM, BN) of a tile: ``q k^T``, the terms, the
    mask; ``-inf`` at keys past ``LK``."""
    s = _dot(q, tl.trans(k), IEEE)
    i = offs_m[:, None]
    j = offs_n[None, :]
    inside, skipped, iy, ix, jy, jx = _pairs(offs_m, offs_n, LQ, LK, SKIP,
                                             GW, QGRID)
    if HAS_K or HAS_Q:
        if HAS_K:  # c^K_i[b(i, j)]: the query row's values
            first, second, use2 = _pair_buckets(iy, ix, jy, jx, skipped,
                                                inside, Rows, Cols, RS, CS,
                                                SX, OFF, E0, E1, PRODUCT)
            row = VK + b * svk_b + h * svk_h + i * svk_l
            s += tl.load(row + first, mask=inside, other=0.).to(tl.float32)
            s += tl.load(row + second, mask=use2, other=0.).to(tl.float32)
        if HAS_Q:  # c^Q_j[b(j, i)]: seen from the key
            first, second, use2 = _pair_buckets(jy, jx, iy, ix, skipped,
                                                inside, Rows, Cols, RS, CS,
                                                SX, OFF, E0, E1, PRODUCT)
            row = VQ + b * svq_b + h * svq_h + j * svq_l
            s += tl.load(row + first, mask=inside, other=0.).to(tl.float32)
            s += tl.load(row + second, mask=use2, other=0.).to(tl.float32)
    if HAS_MASK:
        s += tl.load(Mask + b * sm_b + h * sm_h + i * sm_i + j * sm_j,
                     mask=inside, other=0.).to(tl.float32)
    return tl.where(j < LK, s, float('-inf'))


@triton.jit
def _scatter_rows(Dst, vals, offs_m, offs_n, b, h, sd_b, sd_h, sd_l, LQ, LK,
                  SKIP, GW, Rows, Cols, RS, CS, SX, OFF, E0, E1,
                  PRODUCT: tl.constexpr, QGRID: tl.constexpr,
                  BY_KEY: tl.constexpr):
    """``Dst[r, b(r, o)] += vals`` for the tile's pairs: ``r`` the query
    (``BY_KEY`` False: the term on keys / values) or the key (True: the
    term on queries, ``b(j, i)``); float32 atomic adds."""
    i = offs_m[:, None]
    j = offs_n[None, :]
    inside, skipped, iy, ix, jy, jx = _pairs(offs_m, offs_n, LQ, LK, SKIP,
                                             GW, QGRID)
    if BY_KEY:
        first, second, use2 = _pair_buckets(jy, jx, iy, ix, skipped, inside,
                                            Rows, Cols, RS, CS, SX, OFF, E0,
                                            E1, PRODUCT)
        row = Dst + b * sd_b + h * sd_h + j * sd_l
    else:
        first, second, use2 = _pair_buckets(iy, ix, jy, jx, skipped, inside,
                                            Rows, Cols, RS, CS, SX, OFF, E0,
                                            E1, PRODUCT)
        row = Dst + b * sd_b + h * sd_h + i * sd_l
    tl.atomic_add(row + first, vals, mask=inside)
    tl.atomic_add(row + second, vals, mask=use2)


@triton.jit
def fused_forward_kernel(
        Q, K, V, Out, Lse, Mask, VK, VQ, Sums, Rows, Cols,
        sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l,
        so_b, so_h, so_l, sm_b, sm_h, sm_i, sm_j,
        svk_b, svk_h, svk_l, svq_b, svq_h, svq_l, ss_b, ss_h, ss_l,
        H, LQ, LK, D, DV, SKIP, GW, RS, CS, SX, OFF, E0, E1, SEED, P_DROP,
        HAS_MASK: tl.constexpr, HAS_K: tl.constexpr, HAS_Q: tl.constexpr,
        WITH_SUMS: tl.constexpr, PRODUCT: tl.constexpr, QGRID: tl.constexpr,
        IEEE: tl.constexpr, HAS_DROPOUT: tl.constexpr, BM: tl.constexpr,
        BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    """Output, row log-sum-exp and (``WITH_SUMS``) the bucket sums of a
    block of ``BM`` query rows (module docstring)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    row_ok = offs_m < LQ
    q = _load_rows(Q, b, h, sq_b, sq_h, sq_l, offs_m, LQ, offs_d, D)
    m_i = tl.full((BM, ), float('-inf'), tl.float32)
    l_i = tl.zeros((BM, ), tl.float32)
    acc = tl.zeros((BM, BDV), tl.float32)
    for n0 in range(0, LK, BN):
        offs_n = n0 + tl.arange(0, BN)
        k = _load_rows(K, b, h, sk_b, sk_h, sk_l, offs_n, LK, offs_d, D)
        v = _load_rows(V, b, h, sv_b, sv_h, sv_l, offs_n, LK, offs_dv, DV)
        s = _logit_tile(q, k, offs_m, offs_n, b, h, Mask, VK, VQ, Rows, Cols,
                        sm_b, sm_h, sm_i, sm_j, svk_b, svk_h, svk_l, svq_b,
                        svq_h, svq_l, LQ, LK, SKIP, GW, RS, CS, SX, OFF, E0,
                        E1, HAS_MASK, HAS_K, HAS_Q, PRODUCT, QGRID, IEEE)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # rows masked so far: keep exp() away from (-inf) - (-inf)
        m_safe = tl.where(m_new == float('-inf'), 0., m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if HAS_DROPOUT:  # the normaliser sums the undropped probabilities
            p = p * _dropout_scale(SEED, P_DROP, pid_bh, offs_m, offs_n, LK)
        acc = acc * alpha[:, None] + _dot(p, v, IEEE)
        m_i = m_new
    # a row with every key masked: 0 / 0 (NaN), as the softmax gives
    out = acc / l_i[:, None]
    lse = m_i + tl.log(l_i)
    _store_rows(Out, out, b, h, so_b, so_h, so_l, offs_m, LQ, offs_dv, DV)
    tl.store(Lse + pid_bh.to(tl.int64) * LQ + offs_m, lse, mask=row_ok)
    if WITH_SUMS:  # Eq. 17: the probabilities' bucket sums, exact p
        for n0 in range(0, LK, BN):
            offs_n = n0 + tl.arange(0, BN)
            k = _load_rows(K, b, h, sk_b, sk_h, sk_l, offs_n, LK, offs_d, D)
            s = _logit_tile(q, k, offs_m, offs_n, b, h, Mask, VK, VQ, Rows,
                            Cols, sm_b, sm_h, sm_i, sm_j, svk_b, svk_h, svk_l,
                            svq_b, svq_h, svq_l, LQ, LK, SKIP, GW, RS, CS, SX,
                            OFF, E0, E1, HAS_MASK, HAS_K, HAS_Q, PRODUCT,
                            QGRID, IEEE)
            p = tl.exp(s - lse[:, None])
            if HAS_DROPOUT:  # the value term sees the dropped probabilities
                p = p * _dropout_scale(SEED, P_DROP, pid_bh, offs_m, offs_n,
                                       LK)
            _scatter_rows(Sums, p, offs_m, offs_n, b, h, ss_b, ss_h, ss_l,
                          LQ, LK, SKIP, GW, Rows, Cols, RS, CS, SX, OFF, E0,
                          E1, PRODUCT, QGRID, False)


@triton.jit
def _grad_logits(s, lse, delta, do, v, GS, offs_m, offs_n, b, h, pid_bh,
                 sg_b, sg_h, sg_l, LQ, LK, SKIP, GW, Rows, Cols, RS, CS, SX,
                 OFF, E0, E1, SEED, P_DROP, WITH_SUMS: tl.constexpr,
                 PRODUCT: tl.constexpr, QGRID: tl.constexpr,
                 IEEE: tl.constexpr, HAS_DROPOUT: tl.constexpr):
    """``(P', dE)`` of a tile: ``P = exp(e - lse)``, ``P' = P * M`` with the
    dropout scale ``M`` (1 without dropout), ``dP' = dO v^T (+ ds_i[b(i,
    j)])``, ``dE = P * (M * dP' - delta)``; zero outside the tokens."""
    i = offs_m[:, None]
    inside, skipped, iy, ix, jy, jx = _pairs(offs_m, offs_n, LQ, LK, SKIP,
                                             GW, QGRID)
    p = tl.where(inside, tl.exp(s - lse[:, None]), 0.)
    dp = _dot(do, tl.trans(v), IEEE)
    if WITH_SUMS:  # the term on values: dL/dp_ij += ds_i[b(i, j)]
        first, second, use2 = _pair_buckets(iy, ix, jy, jx, skipped, inside,
                                            Rows, Cols, RS, CS, SX, OFF, E0,
                                            E1, PRODUCT)
        row = GS + b * sg_b + h * sg_h + i * sg_l
        dp += tl.load(row + first, mask=inside, other=0.)
        dp += tl.load(row + second, mask=use2, other=0.)
    if HAS_DROPOUT:
        scale = _dropout_scale(SEED, P_DROP, pid_bh, offs_m, offs_n, LK)
        return p * scale, p * (dp * scale - delta[:, None])
    return p, p * (dp - delta[:, None])


@triton.jit
def fused_backward_kv_kernel(
        Q, K, V, DO, Lse, Delta, Mask, VK, VQ, GS, DK, DV, DVQ, Rows, Cols,
        sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l,
        sdo_b, sdo_h, sdo_l, sm_b, sm_h, sm_i, sm_j,
        svk_b, svk_h, svk_l, svq_b, svq_h, svq_l, sg_b, sg_h, sg_l,
        sdk_b, sdk_h, sdk_l, sdv_b, sdv_h, sdv_l, sdq_b, sdq_h, sdq_l,
        H, LQ, LK, D, DVD, SKIP, GW, RS, CS, SX, OFF, E0, E1, SEED, P_DROP,
        HAS_MASK: tl.constexpr, HAS_K: tl.constexpr, HAS_Q: tl.constexpr,
        WITH_SUMS: tl.constexpr, PRODUCT: tl.constexpr, QGRID: tl.constexpr,
        IEEE: tl.constexpr, HAS_DROPOUT: tl.constexpr, BM: tl.constexpr,
        BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    """``dk``, ``dv`` of a block of ``BN`` keys and, with a term on
    queries, its values' gradient rows of those keys."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    k = _load_rows(K, b, h, sk_b, sk_h, sk_l, offs_n, LK, offs_d, D)
    v = _load_rows(V, b, h, sv_b, sv_h, sv_l, offs_n, LK, offs_dv, DVD)
    dk = tl.zeros((BN, BD), tl.float32)
    dv = tl.zeros((BN, BDV), tl.float32)
    for m0 in range(0, LQ, BM):
        offs_m = m0 + tl.arange(0, BM)
        row_ok = offs_m < LQ
        q = _load_rows(Q, b, h, sq_b, sq_h, sq_l, offs_m, LQ, offs_d, D)
        do = _load_rows(DO, b, h, sdo_b, sdo_h, sdo_l, offs_m, LQ, offs_dv, DVD)
        lse = tl.load(Lse + pid_bh.to(tl.int64) * LQ + offs_m, mask=row_ok,
                      other=0.)
        delta = tl.load(Delta + pid_bh.to(tl.int64) * LQ + offs_m,
                        mask=row_ok, other=0.)
        s = _logit_tile(q, k, offs_m, offs_n, b, h, Mask, VK, VQ, Rows, Cols,
                        sm_b, sm_h, sm_i, sm_j, svk_b, svk_h, svk_l, svq_b,
                        svq_h, svq_l, LQ, LK, SKIP, GW, RS, CS, SX, OFF, E0,
                        E1, HAS_MASK, HAS_K, HAS_Q, PRODUCT, QGRID, IEEE)
        p, de = _grad_logits(s, lse, delta, do, v, GS, offs_m, offs_n, b, h,
                             pid_bh, sg_b, sg_h, sg_l, LQ, LK, SKIP, GW, Rows,
                             Cols, RS, CS, SX, OFF, E0, E1, SEED, P_DROP,
                             WITH_SUMS, PRODUCT, QGRID, IEEE, HAS_DROPOUT)
        dv += _dot(tl.trans(p), do, IEEE)
        dk += _dot(tl.trans(de), q, IEEE)
        if HAS_Q:  # dc^Q_j[b(j, i)] += dE_ij: rows of this block's keys
            _scatter_rows(DVQ, de, offs_m, offs_n, b, h, sdq_b, sdq_h, sdq_l,
                          LQ, LK, SKIP, GW, Rows, Cols, RS, CS, SX, OFF, E0,
                          E1, PRODUCT, QGRID, True)
    _store_rows(DK, dk, b, h, sdk_b, sdk_h, sdk_l, offs_n, LK, offs_d, D)
    _store_rows(DV, dv, b, h, sdv_b, sdv_h, sdv_l, offs_n, LK, offs_dv, DVD)


@triton.jit
def fused_backward_q_kernel(
        Q, K, V, DO, Lse, Delta, Mask, VK, VQ, GS, DQ, DVK, Rows, Cols,
        sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l,
        sdo_b, sdo_h, sdo_l, sm_b, sm_h, sm_i, sm_j,
        svk_b, svk_h, svk_l, svq_b, svq_h, svq_l, sg_b, sg_h, sg_l,
        sdq_b, sdq_h, sdq_l, sdk_b, sdk_h, sdk_l,
        H, LQ, LK, D, DVD, SKIP, GW, RS, CS, SX, OFF, E0, E1, SEED, P_DROP,
        HAS_MASK: tl.constexpr, HAS_K: tl.constexpr, HAS_Q: tl.constexpr,
        WITH_SUMS: tl.constexpr, PRODUCT: tl.constexpr, QGRID: tl.constexpr,
        IEEE: tl.constexpr, HAS_DROPOUT: tl.constexpr, BM: tl.constexpr,
        BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    """``dq`` of a block of ``BM`` queries and, with a term on keys, its
    values' gradient rows of those queries."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    row_ok = offs_m < LQ
    q = _load_rows(Q, b, h, sq_b, sq_h, sq_l, offs_m, LQ, offs_d, D)
    do = _load_rows(DO, b, h, sdo_b, sdo_h, sdo_l, offs_m, LQ, offs_dv, DVD)
    lse = tl.load(Lse + pid_bh.to(tl.int64) * LQ + offs_m, mask=row_ok,
                  other=0.)
    delta = tl.load(Delta + pid_bh.to(tl.int64) * LQ + offs_m, mask=row_ok,
                    other=0.)
    dq = tl.zeros((BM, BD), tl.float32)
    for n0 in range(0, LK, BN):
        offs_n = n0 + tl.arange(0, BN)
        k = _load_rows(K, b, h, sk_b, sk_h, sk_l, offs_n, LK, offs_d, D)
        v = _load_rows(V, b, h, sv_b, sv_h, sv_l, offs_n, LK, offs_dv, DVD)
        s = _logit_tile(q, k, offs_m, offs_n, b, h, Mask, VK, VQ, Rows, Cols,
                        sm_b, sm_h, sm_i, sm_j, svk_b, svk_h, svk_l, svq_b,
                        svq_h, svq_l, LQ, LK, SKIP, GW, RS, CS, SX, OFF, E0,
                        E1, HAS_MASK, HAS_K, HAS_Q, PRODUCT, QGRID, IEEE)
        _, de = _grad_logits(s, lse, delta, do, v, GS, offs_m, offs_n, b, h,
                             pid_bh, sg_b, sg_h, sg_l, LQ, LK, SKIP, GW, Rows,
                             Cols, RS, CS, SX, OFF, E0, E1, SEED, P_DROP,
                             WITH_SUMS, PRODUCT, QGRID, IEEE, HAS_DROPOUT)
        dq += _dot(de, k, IEEE)
        if HAS_K:  # dc^K_i[b(i, j)] += dE_ij: rows of this block's queries
            _scatter_rows(DVK, de, offs_m, offs_n, b, h, sdk_b, sdk_h, sdk_l,
                          LQ, LK, SKIP, GW, Rows, Cols, RS, CS, SX, OFF, E0,
                          E1, PRODUCT, QGRID, False)
    _store_rows(DQ, dq, b, h, sdq_b, sdq_h, sdq_l, offs_m, LQ, offs_d, D)


@triton.jit
def dropout_mask_kernel(Out, SEED, P_DROP, H, LQ, LK, BM: tl.constexpr,
                        BN: tl.constexpr):
    """The dropout scale ``M`` (B * H, LQ, LK) the kernels above draw for
    ``SEED`` and ``P_DROP`` (to reproduce a call's mask)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    base = Out + pid_bh.to(tl.int64) * LQ * LK
    for n0 in range(0, LK, BN):
        offs_n = n0 + tl.arange(0, BN)
        scale = _dropout_scale(SEED, P_DROP, pid_bh, offs_m, offs_n, LK)
        tl.store(base + offs_m[:, None] * LK + offs_n[None, :], scale,
                 mask=(offs_m[:, None] < LQ) & (offs_n[None, :] < LK))
