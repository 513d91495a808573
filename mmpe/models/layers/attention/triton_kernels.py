"""The Triton kernels of the fused attention on CUDA (flash-attention form).

For scaled queries ``q`` (B, H, Q, d), keys ``k`` and values ``v``
(B, H, L, d) and at most one per-axis relative term on each of keys,
queries and values
(:class:`~mmpe.models.layers.terms.relative_term.AxisValues`), the forward
computes, one block of query rows per program and the keys in tiles,

.. math::

    e_{ij} = q_i k_j^T + c^K_i[b(i, j)] + c^Q_j[b(j, i)] + m_{ij}, \\quad
    o_i = \\sum_j p_{ij} v_j, \\quad s_{i\\beta} = \\sum_{j: b(i, j) =
    \\beta} p_{ij}

with the online softmax in base 2 (running maximum and sum, float32), the
row log-sum-exp saved and the bucket sums ``s`` of the term on values
(iRPE, Wu et al. ICCV 2021, Eq. 16-17; the bucket ``b(i, j)`` of Eq. 18 /
the per-axis tables, as the CPU kernel reads it). The backward recomputes
the probabilities from the log-sum-exp: one kernel per block of keys
accumulates ``dk``, ``dv`` and the term on queries' gradient (rows owned
by the key block), one per block of queries ``dq`` and the term on keys'
gradient, with ``dE = P * (dP - delta)``, ``delta_i = dO_i . O_i +
ds_i . s_i``. Attention dropout (``HAS_DROPOUT``) multiplies ``P`` by a
mask scale drawn from Philox by (seed, batch-head, query, key), the same in
every kernel, so nothing of it is stored. The bucket sums of ``P`` and
``dE`` are relaxed (unfenced) float32 atomic adds into rows of the
program's own tokens. No ``(L, L)`` tensor exists.

What keeps the tile lean (``tools/analysis/kernel_report.py`` reads the
compiled code):

- The bucket of a pair is ``part1 + part2`` (product) or the two buckets
  ``part1`` and ``part2`` (cross), read from int32 tables that the launch
  code prepares (``rows * Sx`` / ``rows``; ``cols`` / ``offset + cols``).
  The row part comes from the key's grid row, and a tile of ``BN``
  consecutive grid keys spans at most ``ROWS`` grid rows: each query row
  loads its ``ROWS`` candidates once per tile and every pair selects one,
  so only the column part is gathered per pair.
- Key tiles walk the grid tokens: the leading (skip) tokens have a tile of
  their own, the full tiles run without masks, one masked tail follows.
  A padding mask that is the same for every query (``MASK == 1``) is one
  vector per tile.
- ``exp2`` with ``log2(e)`` folded into one multiply-add; grid geometry,
  head dims and tile sizes are compile-time constants.
"""
import triton
import triton.language as tl

from .triton_tiles import (LOG2E, dot, dropout_scale, grad_logits, key_side,
                           load_tile, logits, next_tile, query_side, scatter,
                           scatter_q, store_tile)


@triton.jit
def _fwd_tile(acc, m_i, l_i, q, K, V, kbase, vbase, sk_l, sv_l, j0, jy0, x0,
              JEND, LK,
              i, vy, vx, qrow_mask, Mask, mbase, sm_j, Rows, Cols, RH, GW,
              VK, qoff_vk, VQ, svq_l, SEED, P_DROP, pid_bh,
              D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
              BDV: tl.constexpr, BN: tl.constexpr, MASK: tl.constexpr,
              HAS_K: tl.constexpr, HAS_Q: tl.constexpr,
              PRODUCT: tl.constexpr, SKIP: tl.constexpr, ROWS: tl.constexpr,
              IEEE: tl.constexpr, HAS_DROPOUT: tl.constexpr,
              EDGE: tl.constexpr):
    """One key tile of the forward, the online softmax's update: keys
    ``j0 + [0, BN)``; ``EDGE`` (the skip tokens' tile, the tail): those
    from ``JEND`` on are masked out."""
    j, jc, jy0, r, jx = key_side(j0, LK, RH, GW, jy0, x0, BN, SKIP, ROWS,
                                 EDGE)
    k = load_tile(K, kbase, j, JEND, sk_l, D, BD, EDGE)
    v = load_tile(V, vbase, j, JEND, sv_l, DV, BDV, EDGE)
    kbias = tl.where(j < JEND, 0., float('-inf'))
    s, _, _, _, _ = logits(q, k, vy, vx, qrow_mask, jc, jy0, r, jx, kbias,
                           Mask, mbase, sm_j, Rows, Cols, RH, GW, VK, qoff_vk,
                           VQ, jc * svq_l, MASK, HAS_K, HAS_Q, False, PRODUCT,
                           SKIP, ROWS, IEEE, EDGE)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # rows masked so far: keep exp2() away from (-inf) - (-inf)
    m_safe = tl.where(m_new == float('-inf'), 0., m_new) * LOG2E
    alpha = tl.math.exp2(m_i * LOG2E - m_safe)
    p = tl.math.exp2(s * LOG2E - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if HAS_DROPOUT:  # the normaliser sums the undropped probabilities
        p = p * dropout_scale(SEED, P_DROP, pid_bh, i, j)
    acc = acc * alpha[:, None] + dot(p, v, IEEE)
    return acc, m_new, l_i


@triton.jit
def _sums_tile(q, K, kbase, sk_l, j0, jy0, x0, JEND, LK, i, vy, vx,
               qrow_mask, Mask,
               mbase, sm_j, Rows, Cols, RH, GW, VK, qoff_vk, VQ, svq_l, lse2,
               S, qoff_s, SEED, P_DROP, pid_bh, D: tl.constexpr,
               BD: tl.constexpr, BN: tl.constexpr, MASK: tl.constexpr,
               HAS_K: tl.constexpr, HAS_Q: tl.constexpr,
               PRODUCT: tl.constexpr, SKIP: tl.constexpr, ROWS: tl.constexpr,
               IEEE: tl.constexpr, HAS_DROPOUT: tl.constexpr,
               EDGE: tl.constexpr):
    """One key tile of the value term's bucket sums (Eq. 17) with the exact
    probabilities ``exp2(e log2(e) - lse2)``."""
    j, jc, jy0, r, jx = key_side(j0, LK, RH, GW, jy0, x0, BN, SKIP, ROWS,
                                 EDGE)
    k = load_tile(K, kbase, j, JEND, sk_l, D, BD, EDGE)
    kbias = tl.where(j < JEND, 0., float('-inf'))
    s, p1, p2, _, _ = logits(q, k, vy, vx, qrow_mask, jc, jy0, r, jx, kbias,
                             Mask, mbase, sm_j, Rows, Cols, RH, GW, VK,
                             qoff_vk, VQ, jc * svq_l, MASK, HAS_K, HAS_Q,
                             True, PRODUCT, SKIP, ROWS, IEEE, EDGE)
    p = tl.math.exp2(s * LOG2E - lse2[:, None])
    if HAS_DROPOUT:  # the value term sees the dropped probabilities
        p = p * dropout_scale(SEED, P_DROP, pid_bh, i, j)
    scatter_q(S, qoff_s, p1, p2, p, Rows, RH, vy, jy0, r, PRODUCT, SKIP,
              ROWS)


@triton.jit
def fused_forward_kernel(
        Q, K, V, Out, Lse, Mask, VK, VQ, Sums, Rows, Cols,
        sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l,
        so_b, so_h, so_l, sm_b, sm_h, sm_i, sm_j,
        svk_b, svk_h, svk_l, svq_b, svq_h, svq_l, ss_b, ss_h, ss_l,
        H, LQ, LK, GW, RH, SEED, P_DROP,
        D: tl.constexpr, DV: tl.constexpr, SKIP: tl.constexpr,
        ROWS: tl.constexpr, MASK: tl.constexpr, HAS_K: tl.constexpr,
        HAS_Q: tl.constexpr, WITH_SUMS: tl.constexpr, PRODUCT: tl.constexpr,
        QGRID: tl.constexpr, IEEE: tl.constexpr, HAS_DROPOUT: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
        BDV: tl.constexpr, BSK: tl.constexpr):
    """Output, row log-sum-exp and (``WITH_SUMS``) the bucket sums of a
    block of ``BM`` query rows (module docstring): the skip tokens' tile,
    the full tiles of grid keys unmasked, the tail."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    i = pid_m * BM + tl.arange(0, BM)
    ic, vy, vx = query_side(i, 0, LQ, RH, GW, 0, 0, SKIP, QGRID, 0)
    q = load_tile(Q, b * sq_b + h * sq_h, i, LQ, sq_l, D, BD, True)
    kbase = b * sk_b + h * sk_h
    vbase = b * sv_b + h * sv_h
    m_i = tl.full((BM, ), float('-inf'), tl.float32)
    l_i = tl.zeros((BM, ), tl.float32)
    acc = tl.zeros((BM, BDV), tl.float32)
    args = (Mask, b * sm_b + h * sm_h, sm_j, Rows, Cols, RH, GW,
            VK + b * svk_b + h * svk_h, ic * svk_l,
            VQ + b * svq_b + h * svq_h, svq_l, SEED, P_DROP, pid_bh)
    qrow_mask = ic.to(tl.int64) * sm_i
    if SKIP > 0:
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, K, V, kbase, vbase, sk_l,
                                  sv_l, 0, 0, 0, SKIP, LK, i, vy, vx,
                                  qrow_mask, *args, D, DV, BD, BDV, BSK,
                                  MASK, HAS_K, HAS_Q, PRODUCT, SKIP, ROWS,
                                  IEEE, HAS_DROPOUT, True)
    full_end = SKIP + (LK - SKIP) // BN * BN
    jy0 = pid_m * 0  # the first full tile's first key: grid origin
    x0 = pid_m * 0
    for j0 in range(SKIP, full_end, BN):
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, K, V, kbase, vbase, sk_l,
                                  sv_l, j0, jy0, x0, LK, LK, i, vy, vx,
                                  qrow_mask, *args, D, DV, BD, BDV, BN, MASK,
                                  HAS_K, HAS_Q, PRODUCT, SKIP, ROWS, IEEE,
                                  HAS_DROPOUT, False)
        jy0, x0 = next_tile(jy0, x0, BN, GW, ROWS)
    if full_end < LK:
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, K, V, kbase, vbase, sk_l,
                                  sv_l, full_end, 0, 0, LK, LK, i, vy, vx,
                                  qrow_mask, *args, D, DV, BD, BDV, BN, MASK,
                                  HAS_K, HAS_Q, PRODUCT, SKIP, ROWS, IEEE,
                                  HAS_DROPOUT, True)
    # a row with every key masked: 0 / 0 (NaN), as the softmax gives
    out = acc / l_i[:, None]
    lse = m_i + tl.log(l_i)
    store_tile(Out, b * so_b + h * so_h, out, i, LQ, so_l, DV, BDV)
    tl.store(Lse + pid_bh.to(tl.int64) * LQ + i, lse, mask=i < LQ)
    if WITH_SUMS:  # Eq. 17: the probabilities' bucket sums, exact p
        # rows past LQ (clamped onto the last row) add nothing
        lse2 = tl.where(i < LQ, lse * LOG2E, float('inf'))
        sargs = (Mask, b * sm_b + h * sm_h, sm_j, Rows, Cols, RH, GW,
                 VK + b * svk_b + h * svk_h, ic * svk_l,
                 VQ + b * svq_b + h * svq_h, svq_l, lse2,
                 Sums + b * ss_b + h * ss_h, ic * ss_l, SEED, P_DROP, pid_bh)
        if SKIP > 0:
            _sums_tile(q, K, kbase, sk_l, 0, 0, 0, SKIP, LK, i, vy, vx,
                       qrow_mask,
                       *sargs, D, BD, BSK, MASK, HAS_K, HAS_Q, PRODUCT,
                       SKIP, ROWS, IEEE, HAS_DROPOUT, True)
        jy0 = pid_m * 0
        x0 = pid_m * 0
        for j0 in range(SKIP, full_end, BN):
            _sums_tile(q, K, kbase, sk_l, j0, jy0, x0, LK, LK, i, vy, vx,
                       qrow_mask, *sargs, D, BD, BN, MASK, HAS_K, HAS_Q,
                       PRODUCT, SKIP, ROWS, IEEE, HAS_DROPOUT, False)
            jy0, x0 = next_tile(jy0, x0, BN, GW, ROWS)
        if full_end < LK:
            _sums_tile(q, K, kbase, sk_l, full_end, 0, 0, LK, LK, i, vy, vx,
                       qrow_mask, *sargs, D, BD, BN, MASK, HAS_K, HAS_Q,
                       PRODUCT, SKIP, ROWS, IEEE, HAS_DROPOUT, True)


@triton.jit
def fused_backward_kv_kernel(
        Q, K, V, DO, Lse, Delta, Mask, VK, VQ, GS, DK, DV, DVQ, Rows, Cols,
        sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l,
        sdo_b, sdo_h, sdo_l, sm_b, sm_h, sm_i, sm_j,
        svk_b, svk_h, svk_l, svq_b, svq_h, svq_l, sg_b, sg_h, sg_l,
        sdk_b, sdk_h, sdk_l, sdv_b, sdv_h, sdv_l, sdq_b, sdq_h, sdq_l,
        H, LQ, LK, GW, RH, SEED, P_DROP,
        D: tl.constexpr, DVD: tl.constexpr, SKIP: tl.constexpr,
        ROWS: tl.constexpr, QROWS: tl.constexpr, MASK: tl.constexpr,
        HAS_K: tl.constexpr, HAS_Q: tl.constexpr, WITH_SUMS: tl.constexpr,
        PRODUCT: tl.constexpr, QGRID: tl.constexpr, IEEE: tl.constexpr,
        HAS_DROPOUT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
        BD: tl.constexpr, BDV: tl.constexpr, BSK: tl.constexpr):
    """``dk``, ``dv`` of a block of ``BN`` keys and, with a term on
    queries, its values' gradient rows of those keys. The keys' positions,
    validity and a key padding mask are fixed for the program (one bias
    vector); the loop walks the query blocks."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    j, jc, jy0, r, jx = key_side(pid_n * BN, LK, RH, GW, 0, 0, BN, SKIP,
                                 ROWS, True)
    k = load_tile(K, b * sk_b + h * sk_h, j, LK, sk_l, D, BD, True)
    v = load_tile(V, b * sv_b + h * sv_h, j, LK, sv_l, DVD, BDV, True)
    mbase = b * sm_b + h * sm_h
    # keys past LK (zero rows of k, v) get probabilities that reach only
    # their own dk, dv rows (never stored) and the scratch row LK of the
    # term on queries' gradient: no bias per pair for them
    kbias = tl.zeros((BN, ), tl.float32)
    if MASK == 1:  # the same for every query: once per program
        kbias = tl.load(Mask + mbase + jc * sm_j).to(tl.float32)
    # the term on queries' gradient rows: this block's keys, or one row of
    # the block where the values are shared by the keys (a bias table:
    # stride 0); keys past LK go to the scratch row past them
    shared = svq_l == 0
    koff_dvq = tl.where(j < LK, tl.where(shared, pid_n, j),
                        tl.where(shared, tl.cdiv(LK, BN), LK)) * sdq_l
    VKbh = VK + b * svk_b + h * svk_h
    VQbh = VQ + b * svq_b + h * svq_h
    GSbh = GS + b * sg_b + h * sg_h
    qbase = b * sq_b + h * sq_h
    dobase = b * sdo_b + h * sdo_h
    lsebase = Lse + pid_bh.to(tl.int64) * LQ
    deltabase = Delta + pid_bh.to(tl.int64) * LQ
    dk = tl.zeros((BN, BD), tl.float32)
    dv = tl.zeros((BN, BDV), tl.float32)
    qy0 = pid_n * 0  # the first block's first row: grid origin, after the
    qx0 = pid_n * 0 - SKIP  # skip tokens
    for m0 in range(0, LQ, BM):
        i = m0 + tl.arange(0, BM)
        ic, vy, vx = query_side(i, m0, LQ, RH, GW, qy0, qx0, SKIP, QGRID,
                                QROWS)
        q = load_tile(Q, qbase, i, LQ, sq_l, D, BD, True)
        do = load_tile(DO, dobase, i, LQ, sdo_l, DVD, BDV, True)
        lse2 = tl.load(lsebase + i, mask=i < LQ,
                       other=float('inf')) * LOG2E
        delta = tl.load(deltabase + i, mask=i < LQ, other=0.)
        s, p1, p2, q1, q2 = logits(
            q, k, vy, vx, ic.to(tl.int64) * sm_i, jc, jy0, r, jx, kbias,
            Mask, mbase, sm_j, Rows, Cols, RH, GW, VKbh, ic * svk_l, VQbh,
            jc * svq_l, MASK * (MASK == 2), HAS_K, HAS_Q, WITH_SUMS, PRODUCT,
            SKIP, ROWS, IEEE, MASK == 1)
        p, de = grad_logits(s, lse2, delta, do, v, GSbh, ic * sg_l, p1, p2,
                            Rows, RH, vy, jy0, r, i, j, SEED, P_DROP, pid_bh,
                            WITH_SUMS, PRODUCT, SKIP, ROWS, IEEE,
                            HAS_DROPOUT)
        dv += dot(tl.trans(p), do, IEEE)
        dk += dot(tl.trans(de), q, IEEE)
        if HAS_Q:  # dc^Q_j[b(j, i)] += dE_ij: rows of this block's keys
            scatter(DVQ + b * sdq_b + h * sdq_h, koff_dvq, q1, q2, de, True,
                    PRODUCT)
        if QROWS > 0:
            qy0, qx0 = next_tile(qy0, qx0, BM, GW, QROWS)
    store_tile(DK, b * sdk_b + h * sdk_h, dk, j, LK, sdk_l, D, BD)
    store_tile(DV, b * sdv_b + h * sdv_h, dv, j, LK, sdv_l, DVD, BDV)


@triton.jit
def _bwd_q_tile(dq, q, do, lse2, delta, K, V, kbase, vbase, sk_l, sv_l, j0,
                jy0, x0, JEND, LK, i, vy, vx, qrow_mask, Mask, mbase, sm_j,
                Rows, Cols, RH, GW, VK, qoff_vk, VQ, svq_l, GS, qoff_gs, DVK,
                qoff_dvk, SEED, P_DROP, pid_bh, D: tl.constexpr,
                DVD: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                BN: tl.constexpr, MASK: tl.constexpr, HAS_K: tl.constexpr,
                HAS_Q: tl.constexpr, WITH_SUMS: tl.constexpr,
                PRODUCT: tl.constexpr, SKIP: tl.constexpr, ROWS: tl.constexpr,
                IEEE: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                EDGE: tl.constexpr):
    """One key tile of the query block's backward: ``dq`` and the term on
    keys' gradient (bucket sums of ``dE`` into the block's own rows)."""
    j, jc, jy0, r, jx = key_side(j0, LK, RH, GW, jy0, x0, BN, SKIP, ROWS,
                                 EDGE)
    k = load_tile(K, kbase, j, JEND, sk_l, D, BD, EDGE)
    v = load_tile(V, vbase, j, JEND, sv_l, DVD, BDV, EDGE)
    kbias = tl.where(j < JEND, 0., float('-inf'))
    s, p1, p2, _, _ = logits(q, k, vy, vx, qrow_mask, jc, jy0, r, jx, kbias,
                             Mask, mbase, sm_j, Rows, Cols, RH, GW, VK,
                             qoff_vk, VQ, jc * svq_l, MASK, HAS_K, HAS_Q,
                             WITH_SUMS, PRODUCT, SKIP, ROWS, IEEE, EDGE)
    _, de = grad_logits(s, lse2, delta, do, v, GS, qoff_gs, p1, p2, Rows, RH,
                        vy, jy0, r, i, j, SEED, P_DROP, pid_bh, WITH_SUMS,
                        PRODUCT, SKIP, ROWS, IEEE, HAS_DROPOUT)
    dq += dot(de, k, IEEE)
    if HAS_K:  # dc^K_i[b(i, j)] += dE_ij: rows of this block's queries
        scatter_q(DVK, qoff_dvk, p1, p2, de, Rows, RH, vy, jy0, r, PRODUCT,
                  SKIP, ROWS)
    return dq


@triton.jit
def fused_backward_q_kernel(
        Q, K, V, DO, Lse, Delta, Mask, VK, VQ, GS, DQ, DVK, Rows, Cols,
        sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l,
        sdo_b, sdo_h, sdo_l, sm_b, sm_h, sm_i, sm_j,
        svk_b, svk_h, svk_l, svq_b, svq_h, svq_l, sg_b, sg_h, sg_l,
        sdq_b, sdq_h, sdq_l, sdk_b, sdk_h, sdk_l,
        H, LQ, LK, GW, RH, SEED, P_DROP,
        D: tl.constexpr, DVD: tl.constexpr, SKIP: tl.constexpr,
        ROWS: tl.constexpr, MASK: tl.constexpr, HAS_K: tl.constexpr,
        HAS_Q: tl.constexpr, WITH_SUMS: tl.constexpr, PRODUCT: tl.constexpr,
        QGRID: tl.constexpr, IEEE: tl.constexpr, HAS_DROPOUT: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
        BDV: tl.constexpr, BSK: tl.constexpr):
    """``dq`` of a block of ``BM`` queries and, with a term on keys, its
    values' gradient rows of those queries: the key tiles as in the
    forward (skip tokens, full tiles unmasked, the tail)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    i = pid_m * BM + tl.arange(0, BM)
    ic, vy, vx = query_side(i, 0, LQ, RH, GW, 0, 0, SKIP, QGRID, 0)
    q = load_tile(Q, b * sq_b + h * sq_h, i, LQ, sq_l, D, BD, True)
    do = load_tile(DO, b * sdo_b + h * sdo_h, i, LQ, sdo_l, DVD, BDV, True)
    lse2 = tl.load(Lse + pid_bh.to(tl.int64) * LQ + i, mask=i < LQ,
                   other=float('inf')) * LOG2E
    delta = tl.load(Delta + pid_bh.to(tl.int64) * LQ + i, mask=i < LQ,
                    other=0.)
    kbase = b * sk_b + h * sk_h
    vbase = b * sv_b + h * sv_h
    qrow_mask = ic.to(tl.int64) * sm_i
    args = (Mask, b * sm_b + h * sm_h, sm_j, Rows, Cols, RH, GW,
            VK + b * svk_b + h * svk_h, ic * svk_l,
            VQ + b * svq_b + h * svq_h, svq_l,
            GS + b * sg_b + h * sg_h, ic * sg_l,
            # the term on keys' gradient rows: this block's queries, or one
            # row of the block where the values are shared by the queries
            DVK + b * sdk_b + h * sdk_h,
            tl.where(svk_l == 0, pid_m, ic) * sdk_l, SEED, P_DROP, pid_bh)
    dq = tl.zeros((BM, BD), tl.float32)
    if SKIP > 0:
        dq = _bwd_q_tile(dq, q, do, lse2, delta, K, V, kbase, vbase, sk_l,
                         sv_l, 0, 0, 0, SKIP, LK, i, vy, vx, qrow_mask,
                         *args, D, DVD, BD, BDV, BSK, MASK, HAS_K, HAS_Q,
                         WITH_SUMS, PRODUCT, SKIP, ROWS, IEEE, HAS_DROPOUT,
                         True)
    full_end = SKIP + (LK - SKIP) // BN * BN
    jy0 = pid_m * 0  # the first full tile's first key: grid origin
    x0 = pid_m * 0
    for j0 in range(SKIP, full_end, BN):
        dq = _bwd_q_tile(dq, q, do, lse2, delta, K, V, kbase, vbase, sk_l,
                         sv_l, j0, jy0, x0, LK, LK, i, vy, vx, qrow_mask,
                         *args, D, DVD, BD, BDV, BN, MASK, HAS_K, HAS_Q,
                         WITH_SUMS, PRODUCT, SKIP, ROWS, IEEE, HAS_DROPOUT,
                         False)
        jy0, x0 = next_tile(jy0, x0, BN, GW, ROWS)
    if full_end < LK:
        dq = _bwd_q_tile(dq, q, do, lse2, delta, K, V, kbase, vbase, sk_l,
                         sv_l, full_end, 0, 0, LK, LK, i, vy, vx, qrow_mask,
                         *args, D, DVD, BD, BDV, BN, MASK, HAS_K, HAS_Q,
                         WITH_SUMS, PRODUCT, SKIP, ROWS, IEEE, HAS_DROPOUT,
                         True)
    store_tile(DQ, b * sdq_b + h * sdq_h, dq, i, LQ, sdq_l, D, BD)


@triton.jit
def dropout_mask_kernel(Out, SEED, P_DROP, H, LQ, LK, BM: tl.constexpr,
                        BN: tl.constexpr):
    """The dropout scale ``M`` (B * H, LQ, LK) the kernels above draw for
    ``SEED`` and ``P_DROP`` (to reproduce a call's mask)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    i = pid_m * BM + tl.arange(0, BM)
    base = Out + pid_bh.to(tl.int64) * LQ * LK
    for n0 in range(0, LK, BN):
        j = n0 + tl.arange(0, BN)
        scale = dropout_scale(SEED, P_DROP, pid_bh, i, j)
        tl.store(base + i.to(tl.int64)[:, None] * LK + j[None, :], scale,
                 mask=(i[:, None] < LQ) & (j[None, :] < LK))
