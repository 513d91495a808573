"""The tile steps of the fused Triton kernels (:mod:`.triton_kernels`).

Loads and stores of row tiles, the tensor-core product, the dropout scale,
the grid positions of a tile's queries and keys, the pairs' buckets of a
per-axis term (:class:`~mmpe.models.layers.terms.relative_term.AxisValues`
as the launch code's int32 tables give them), the gather of the terms'
values and the scatter of their gradients, the logits of a tile and its
gradient: everything the forward and both backward kernels share.
"""
import triton
import triton.language as tl

#: log2(e): the softmax in base 2 (exp2)
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def load_tile(X, base, offs, N, s_l, D: tl.constexpr, BD: tl.constexpr,
               MASKED: tl.constexpr):
    """Rows ``offs`` of a (., D) slab at ``X + base`` (row stride ``s_l``,
    contiguous last dim), as a (len(offs), BD) tile; rows past ``N`` (when
    ``MASKED``) and columns past ``D`` read as 0."""
    cols = tl.arange(0, BD)
    ptrs = X + base + offs[:, None] * s_l + cols[None, :]
    if MASKED:
        return tl.load(ptrs, mask=(offs[:, None] < N) & (cols[None, :] < D),
                       other=0.)
    if BD != D:
        return tl.load(ptrs, mask=cols[None, :] < D, other=0.)
    return tl.load(ptrs)


@triton.jit
def store_tile(X, base, val, offs, N, s_l, D: tl.constexpr,
                BD: tl.constexpr):
    """The counterpart of :func:`load_tile` (rows past ``N`` skipped)."""
    cols = tl.arange(0, BD)
    tl.store(X + base + offs[:, None] * s_l + cols[None, :],
             val.to(X.dtype.element_ty),
             mask=(offs[:, None] < N) & (cols[None, :] < D))


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    """``a @ b`` accumulated in float32: IEEE float32 products, or the
    tensor cores' products of ``b``'s dtype (``a`` cast to it; float32:
    TF32, Triton's default input precision)."""
    if IEEE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32),
                      input_precision='ieee')
    return tl.dot(a.to(b.dtype), b)


@triton.jit
def dropout_scale(SEED, P_DROP, pid_bh, i, j):
    """Attention dropout of a tile: ``1 / (1 - p)`` where kept, 0 where
    dropped. Philox keyed by ``SEED + pid_bh`` with the pair's (key, query)
    as two 32-bit counters (no product of token indices: no overflow at any
    length); the forward and both backward kernels draw the same mask."""
    jj = (j[None, :] + i[:, None] * 0).to(tl.uint32)
    ii = (i[:, None] + j[None, :] * 0).to(tl.uint32)
    zero = jj * 0
    r, _, _, _ = tl.philox(SEED + pid_bh, jj, ii, zero, zero)
    keep = tl.uint_to_uniform_float(r) >= P_DROP
    return tl.where(keep, 1.0 / (1.0 - P_DROP), 0.)


@triton.jit
def query_side(i, i0, LQ, RH, GW, qy0, qx0, SKIP: tl.constexpr,
               QGRID: tl.constexpr, QROWS: tl.constexpr):
    """Per query row: the token clamped into range (a row past ``LQ`` is
    read, never stored) and the grid row and column it views from; a skip
    token views from the tables' extra row / column (``RH``, ``GW``: every
    bucket there is the extra bucket), a query off the grid from the
    origin. ``QROWS`` > 0 (a loop over query blocks): the block's first
    row ``i0`` is at grid row ``qy0``, column ``qx0`` (:func:`next_tile`;
    negative for skip tokens) and spans at most ``QROWS`` grid rows, so that no
    division is made per block."""
    ic = tl.minimum(i, LQ - 1)
    if QGRID:
        g = i - SKIP
        if QROWS == 0:
            gc = tl.maximum(tl.minimum(g, LQ - 1 - SKIP), 0)
            vy = gc // GW
            vx = gc - vy * GW
        else:
            x = qx0 + (i - i0)
            r = tl.zeros_like(x)
            for t in tl.static_range(1, QROWS):
                r += (x >= t * GW).to(tl.int32)
            # rows past the queries view from the extra row and column
            # (both: a row part of the extra bucket with a real column
            # part would be a bucket past the table)
            vy = tl.where(i < LQ, qy0 + r, RH)
            vx = tl.where(i < LQ, x - r * GW, GW)
        if SKIP > 0:
            vy = tl.where(g < 0, RH, vy)
            vx = tl.where(g < 0, GW, vx)
        return ic, vy, vx
    return ic, ic * 0, ic * 0


@triton.jit
def key_side(j0, LK, RH, GW, jy0, x0, BN: tl.constexpr, SKIP: tl.constexpr,
             ROWS: tl.constexpr, EDGE: tl.constexpr):
    """Keys ``j0 + [0, BN)``: each clamped into range, the tile's first grid
    row ``jy0`` and per key its row past it ``r`` and its column ``jx``. A
    tile of ``BN`` consecutive grid keys spans at most ``ROWS`` grid rows
    (``r < ROWS``); a skip key gets ``r = ROWS`` and the extra column
    ``GW`` (with ``ROWS == 0``, narrow grids: ``jy0 + r`` is the key's
    row, the extra row ``RH`` for a skip key). The full tiles of a loop
    take the first key's grid row and column ``(jy0, x0)`` from
    :func:`next_tile` (no division per tile); ``EDGE`` tiles and narrow
    grids compute them."""
    j = j0 + tl.arange(0, BN)
    if EDGE:  # keys past LK clamped onto the last, skip keys to the origin
        jy0 = tl.maximum(j0 - SKIP, 0) // GW
        jc = tl.minimum(j, LK - 1)
        g = jc - SKIP
        x = tl.maximum(g - jy0 * GW, 0)
    elif ROWS == 0:
        jy0 = (j0 - SKIP) // GW
        jc = j
        x = j - SKIP - jy0 * GW
    else:  # grid keys all
        jc = j
        x = x0 + tl.arange(0, BN)
    if ROWS == 0:
        r = x // GW
    else:
        r = tl.zeros([BN], dtype=tl.int32)
        for t in tl.static_range(1, ROWS):
            r += (x >= t * GW).to(tl.int32)
    jx = x - r * GW
    if SKIP > 0 and EDGE:
        if ROWS == 0:
            r = tl.where(g < 0, RH - jy0, r)
        else:
            r = tl.where(g < 0, ROWS, r)
        jx = tl.where(g < 0, GW, jx)
    return j, jc, jy0, r, jx


@triton.jit
def next_tile(jy0, x0, BN: tl.constexpr, GW, ROWS: tl.constexpr):
    """The grid row and column of the first key of the next full tile
    (``BN`` keys on): at most ``ROWS`` wraps past the grid's width."""
    x0 += BN
    for _ in tl.static_range(ROWS):
        wrap = x0 >= GW
        x0 = tl.where(wrap, x0 - GW, x0)
        jy0 += wrap.to(tl.int32)
    return jy0, x0


@triton.jit
def buckets(Rows, Cols, RH, GW, vy, vx, jy0, r, jx, BY_KEY: tl.constexpr,
            SKIP: tl.constexpr, ROWS: tl.constexpr, PRODUCT: tl.constexpr,
            NO_ROW: tl.constexpr = False):
    """The pairs' bucket parts ``(part1, part2)`` (BM, BN) int32 of a term
    seen from the query (``BY_KEY`` False: ``rows[iy, jy]``, ``cols[ix,
    jx]``) or from the key (``rows[jy, iy]``, ``cols[jx, ix]``), ``vy`` /
    ``vx`` the query rows' grid position, ``(jy0, r, jx)`` the keys'
    (:func:`key_side`). The tables are (RH + 1, RH + 1) and (GW + 1, GW +
    1) int32 with the skip tokens' extra row and column. The row part:
    each query row loads its candidates ``rows[iy, jy0 + t]`` once and the
    pair selects one by the key's ``r``; the column part is gathered per
    pair. Product: ``(part1 + part2, 0)``; ``NO_ROW``: ``(0, part2)`` (the
    row part's values come per row, :func:`row_values`)."""
    RS = RH + 1
    CS = GW + 1
    if NO_ROW:
        part1 = (r[None, :] + vy[:, None]) * 0
    elif ROWS == 0:
        jy = jy0 + r
        if BY_KEY:
            part1 = tl.load(Rows + jy[None, :] * RS + vy[:, None])
        else:
            part1 = tl.load(Rows + vy[:, None] * RS + jy[None, :])
    else:
        if BY_KEY:
            first = tl.load(Rows + jy0 * RS + vy)
        else:
            first = tl.load(Rows + vy * RS + jy0)
        part1 = tl.broadcast_to(first[:, None], (vy.shape[0], r.shape[0]))
        for t in tl.static_range(1, ROWS + (SKIP > 0)):
            row = tl.minimum(jy0 + t, RH) if t < ROWS else RH
            if BY_KEY:
                cand = tl.load(Rows + row * RS + vy)
            else:
                cand = tl.load(Rows + vy * RS + row)
            part1 = tl.where(r[None, :] == t, cand[:, None], part1)
    # a 64-bit pointer per row (or key) and an int32 offset per pair: one
    # wide multiply-add per pair's address, no 64-bit tile kept
    if BY_KEY:
        part2 = tl.load((Cols + jx * CS)[None, :] + vx[:, None])
    else:
        part2 = tl.load((Cols + vx * CS)[:, None] + jx[None, :])
    if PRODUCT:  # one bucket: one int32 tile kept, not two
        return part1 + part2, part2 * 0
    return part1, part2


@triton.jit
def row_values(base, off, Rows, RH, vy, jy0, r, SKIP: tl.constexpr,
               ROWS: tl.constexpr):
    """A cross term seen from the query: the row part's values of the
    tile's pairs, ``base[off_i + rows[iy, jy]]`` float32 (BM, BN), loaded
    once per query row and candidate grid row ``jy0 + t`` (and the skip
    tokens' extra row) and selected per pair by the key's ``r``."""
    RS = RH + 1
    row = base + off
    first = tl.load(row + tl.load(Rows + vy * RS + jy0)).to(tl.float32)
    out = tl.broadcast_to(first[:, None], (vy.shape[0], r.shape[0]))
    for t in tl.static_range(1, ROWS + (SKIP > 0)):
        grid_row = tl.minimum(jy0 + t, RH) if t < ROWS else RH
        cand = tl.load(row + tl.load(Rows + vy * RS + grid_row))
        out = tl.where(r[None, :] == t, cand.to(tl.float32)[:, None], out)
    return out


@triton.jit
def scatter_rows(base, off, Rows, RH, vy, jy0, r, vals, SKIP: tl.constexpr,
                 ROWS: tl.constexpr):
    """The adjoint of :func:`row_values`: each query row's sums of
    ``vals`` over the keys of each candidate grid row, one relaxed atomic
    add per row and candidate (not per pair)."""
    RS = RH + 1
    row = base + off
    rest = tl.sum(vals, 1)
    for t in tl.static_range(1, ROWS + (SKIP > 0)):
        grid_row = tl.minimum(jy0 + t, RH) if t < ROWS else RH
        part = tl.sum(tl.where(r[None, :] == t, vals, 0.), 1)
        tl.atomic_add(row + tl.load(Rows + vy * RS + grid_row), part,
                      sem='relaxed')
        rest -= part
    tl.atomic_add(row + tl.load(Rows + vy * RS + jy0), rest, sem='relaxed')


@triton.jit
def gather_q(base, off, part1, part2, Rows, RH, vy, jy0, r,
             PRODUCT: tl.constexpr, SKIP: tl.constexpr, ROWS: tl.constexpr):
    """:func:`gather` of a term seen from the query; a cross term whose
    tile spans one or two grid rows reads its row part per row
    (:func:`row_values`)."""
    if not PRODUCT and (ROWS == 1 or ROWS == 2):
        row = (base + off)[:, None]
        return (row_values(base, off, Rows, RH, vy, jy0, r, SKIP, ROWS) +
                tl.load(row + part2).to(tl.float32))
    return gather(base, off, part1, part2, False, PRODUCT)


@triton.jit
def scatter_q(base, off, part1, part2, vals, Rows, RH, vy, jy0, r,
              PRODUCT: tl.constexpr, SKIP: tl.constexpr, ROWS: tl.constexpr):
    """:func:`scatter` of a term seen from the query (the adjoint of
    :func:`gather_q`)."""
    if not PRODUCT and (ROWS == 1 or ROWS == 2):
        scatter_rows(base, off, Rows, RH, vy, jy0, r, vals, SKIP, ROWS)
        tl.atomic_add((base + off)[:, None] + part2, vals, sem='relaxed')
    else:
        scatter(base, off, part1, part2, vals, False, PRODUCT)


@triton.jit
def gather(base, off, part1, part2, BY_KEY: tl.constexpr,
           PRODUCT: tl.constexpr):
    """The pairs' values (float32) from the viewers' rows of values: ``base``
    the head's values, ``off`` each viewer's row offset (int32; one per
    query row, or per key with ``BY_KEY``); the bucket ``part1`` (product:
    :func:`buckets` gives it whole) or the sum of both buckets' values
    (cross)."""
    if BY_KEY:
        row = (base + off)[None, :]
    else:
        row = (base + off)[:, None]
    if PRODUCT:
        return tl.load(row + part1).to(tl.float32)
    return (tl.load(row + part1).to(tl.float32) +
            tl.load(row + part2).to(tl.float32))


@triton.jit
def scatter(base, off, part1, part2, vals, BY_KEY: tl.constexpr,
            PRODUCT: tl.constexpr):
    """``base[off + bucket] += vals`` (the adjoint of :func:`gather`):
    relaxed float32 atomic adds, no memory fence (nothing reads the sums
    before the kernel ends). Pairs outside the tokens carry 0 to a clamped
    row."""
    if BY_KEY:
        row = (base + off)[None, :]
    else:
        row = (base + off)[:, None]
    if PRODUCT:
        tl.atomic_add(row + part1, vals, sem='relaxed')
    else:
        tl.atomic_add(row + part1, vals, sem='relaxed')
        tl.atomic_add(row + part2, vals, sem='relaxed')


@triton.jit
def logits(q, k, vy, vx, qrow_mask, jc, jy0, r, jx, kbias, Mask, mbase,
           sm_j, Rows, Cols, RH, GW, VK, qoff_vk, VQ, koff_vq,
            MASK: tl.constexpr, HAS_K: tl.constexpr, HAS_Q: tl.constexpr,
            KB: tl.constexpr, PRODUCT: tl.constexpr, SKIP: tl.constexpr,
            ROWS: tl.constexpr, IEEE: tl.constexpr, BIAS: tl.constexpr):
    """The float32 logits (BM, BN) of a tile, ``q k^T`` + the terms + the
    mask (``MASK`` 1: a vector of the keys, 2: per pair, ``qrow_mask`` the
    rows' 64-bit offsets: ``L * L`` may pass 2^31) + ``kbias`` (``BIAS``:
    per key, 0 or ``-inf``), and the pairs' buckets seen from the query
    (``KB`` or a term on keys) and from the key (a term on queries), for
    the value term and the gradients."""
    s = dot(q, tl.trans(k), IEEE)
    p1 = s.to(tl.int32) * 0
    p2 = p1
    q1 = p1
    q2 = p1
    if KB or HAS_K:
        p1, p2 = buckets(Rows, Cols, RH, GW, vy, vx, jy0, r, jx, False,
                         SKIP, ROWS, PRODUCT,
                         not PRODUCT and (ROWS == 1 or ROWS == 2))
    if HAS_K:  # c^K_i[b(i, j)]: the query row's values
        s += gather_q(VK, qoff_vk, p1, p2, Rows, RH, vy, jy0, r, PRODUCT,
                      SKIP, ROWS)
    if HAS_Q:  # c^Q_j[b(j, i)]: seen from the key
        q1, q2 = buckets(Rows, Cols, RH, GW, vy, vx, jy0, r, jx, True,
                         SKIP, ROWS, PRODUCT)
        s += gather(VQ, koff_vq, q1, q2, True, PRODUCT)
    if MASK == 1:
        s += tl.load(Mask + mbase + jc * sm_j).to(tl.float32)[None, :]
    if MASK == 2:
        s += tl.load(Mask + mbase + qrow_mask[:, None] +
                     jc[None, :] * sm_j).to(tl.float32)
    if BIAS:
        s += kbias[None, :]
    return s, p1, p2, q1, q2


@triton.jit
def grad_logits(s, lse2, delta, do, v, GS, qoff_gs, p1, p2, Rows, RH, vy,
                jy0, r, i, j, SEED, P_DROP, pid_bh, WITH_SUMS: tl.constexpr,
                PRODUCT: tl.constexpr, SKIP: tl.constexpr,
                ROWS: tl.constexpr, IEEE: tl.constexpr,
                HAS_DROPOUT: tl.constexpr):
    """``(P', dE)`` of a tile: ``P = exp2(e log2(e) - lse2)``, ``P' = P *
    M`` with the dropout scale ``M`` (1 without dropout), ``dP' = dO v^T (+
    ds_i[b(i, j)])``, ``dE = P * (M * dP' - delta)``; 0 at masked pairs and
    rows past the queries (``lse2 = +inf``)."""
    p = tl.math.exp2(s * LOG2E - lse2[:, None])
    dp = dot(do, tl.trans(v), IEEE)
    if WITH_SUMS:  # the term on values: dL/dp_ij += ds_i[b(i, j)]
        dp += gather_q(GS, qoff_gs, p1, p2, Rows, RH, vy, jy0, r, PRODUCT,
                       SKIP, ROWS)
    if HAS_DROPOUT:
        scale = dropout_scale(SEED, P_DROP, pid_bh, i, j)
        return p * scale, p * (dp * scale - delta[:, None])
    return p, p * (dp - delta[:, None])
