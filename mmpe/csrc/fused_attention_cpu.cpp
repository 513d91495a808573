// Fused CPU attention with relative terms over per-axis buckets.
//
// For scaled queries q, keys k, values v (B, H, L, d) of `skip` leading
// tokens and an h x w token grid (L = skip + h * w) it computes, one block of
// query rows at a time,
//
//   e_ij = q_i . k_j + T_ij + U_ij + m_ij,  p_ij = softmax_j(e_ij),
//   o_i = sum_j p_ij v_j,  and optionally  s_i[b] = sum_{j: b(i, j) = b} p_ij
//
// with iRPE's terms (Wu et al., ICCV 2021, Eq. 16-17) read from per-axis
// buckets u = ry(iy, jy), v = rx(ix, jx) of grid tokens (the tables `rows`
// (h, h) and `cols` (w, w)):
//
//   on keys:    T_ij = c_i[u * Sx + v] (product) or c_i[u] + c_i[o + v]
//               (cross; also ViTDet's / MViTv2's decomposed relative
//               position, plain offsets as buckets), c_i the values of the
//               query i (the lookup q_i . r^K_b of Eq. 27, or a bias table);
//   on queries: U_ij = c'_j[b(j, i)], the same seen from the key j;
//   on values:  the bucket sums s_i of Eq. 17 (o_i += s_i r^V is the
//               caller's), and dL/ds_i expanded into dL/dp_ij.
//
// A pair with one of the leading tokens (class tokens) uses the extra
// bucket(s) x0 (+ x1 in the cross method). m is an additive mask. The
// forward saves the row log-sum-exp; the backward recomputes each block's
// probabilities from it and gives dq, dk, dv and the values' gradients (the
// bucket sums of dE = P * (dP - rowsum(dP * P))). Each block of R query
// rows against all keys stays in the core's cache (R * L elements); the
// logits, the terms, the mask and the softmax are one pass over it, and no
// (L, L) tensor exists. The matrix products go through ATen (MKL / oneDNN on
// the block views).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

// exp(x) for float, Cephes' expf (range reduction by ln 2, degree-6
// polynomial, about 1 ulp), written so that the loops calling it vectorise;
// exp(-inf) = 0 (masked keys), NaN stays NaN.
inline float exp_impl(float x) {
  const float lo = -87.3365447f;  // below: 0 (a denormal or 0 in expf too)
  const float hi = 88.7228394f;
  const float xc = std::min(std::max(x, lo), hi);
  const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float y =
      p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  // NaN in, NaN out (a fully masked row, as the explicit backend gives)
  return x < lo ? 0.0f : (x == x ? y : x);
}

inline double exp_impl(double x) { return std::exp(x); }

// The geometry of the term: per-axis bucket tables, the values' layout
// and the leading tokens outside the grid (class tokens).
struct Geometry {
  const int64_t* rows;  // (h, h): ry(iy, jy)
  const int64_t* cols;  // (w, w): rx(ix, jx)
  int64_t h, w, sy, sx;
  bool product;
  int64_t col_offset;  // cross: column buckets start here
  int64_t skip;        // leading tokens outside the grid
  int64_t extra0, extra1;  // their bucket(s) (cross: one per axis; -1: none)
};

// A (B, H, L, n) tensor read through its strides (last stride 1).
template <typename T>
struct Strided4 {
  const T* data;
  int64_t sb, sh, si;
  const T* row(int64_t b, int64_t hd, int64_t i) const {
    return data + b * sb + hd * sh + i * si;
  }
};

template <typename T>
Strided4<T> strided4(const at::Tensor& t) {
  return {t.data_ptr<T>(), t.stride(0), t.stride(1), t.stride(2)};
}

// s[j] += a (+ m[j]) for n entries.
template <typename T>
void add_const(T* s, T a, const T* m, int64_t n) {
  if (m) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) s[j] += a + m[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) s[j] += a;
  }
}

template <typename T>
T extra_value(const T* c, const Geometry& g) {
  return c[g.extra0] + (g.extra1 >= 0 ? c[g.extra1] : T(0));
}

// s[j] += T_ij (+ m_ij) for the query i, over all L keys. `pat` is scratch
// of sy * w (product) or w (cross) elements.
template <typename T>
void add_term_row(T* s, const T* c, const T* mask, int64_t i,
                  const Geometry& g, T* pat) {
  if (g.skip) {  // pairs with a token outside the grid: its bucket(s)
    const T e = extra_value(c, g);
    if (i < g.skip) {
      add_const(s, e, mask, g.skip + g.h * g.w);
      return;
    }
    add_const(s, e, mask, g.skip);
    s += g.skip;
    mask = mask ? mask + g.skip : nullptr;
    i -= g.skip;
  }
  const int64_t iy = i / g.w, ix = i % g.w, w = g.w;
  const int64_t* ry = g.rows + iy * g.h;
  const int64_t* rx = g.cols + ix * w;
  if (g.product) {
    for (int64_t u = 0; u < g.sy; ++u) {
      const T* cu = c + u * g.sx;
      T* pu = pat + u * w;
      for (int64_t jx = 0; jx < w; ++jx) pu[jx] = cu[rx[jx]];
    }
    for (int64_t jy = 0; jy < g.h; ++jy) {
      const T* pu = pat + ry[jy] * w;
      T* sr = s + jy * w;
      if (mask) {
        const T* mr = mask + jy * w;
#pragma omp simd
        for (int64_t jx = 0; jx < w; ++jx) sr[jx] += pu[jx] + mr[jx];
      } else {
#pragma omp simd
        for (int64_t jx = 0; jx < w; ++jx) sr[jx] += pu[jx];
      }
    }
  } else {
    for (int64_t jx = 0; jx < w; ++jx) pat[jx] = c[g.col_offset + rx[jx]];
    for (int64_t jy = 0; jy < g.h; ++jy) {
      const T a = c[ry[jy]];
      T* sr = s + jy * w;
      if (mask) {
        const T* mr = mask + jy * w;
#pragma omp simd
        for (int64_t jx = 0; jx < w; ++jx) sr[jx] += a + pat[jx] + mr[jx];
      } else {
#pragma omp simd
        for (int64_t jx = 0; jx < w; ++jx) sr[jx] += a + pat[jx];
      }
    }
  }
}

template <typename T>
T sum_row(const T* x, int64_t n) {
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  return sum;
}

// dc_i[b] += sum_{j: b(i, j) = b} dE_ij for the query i; `acc` is scratch
// of sy * w (product) or w (cross) elements.
template <typename T>
void reduce_term_row(const T* de, T* dc, int64_t i, const Geometry& g,
                     T* acc) {
  if (g.skip) {
    const int64_t n = i < g.skip ? g.skip + g.h * g.w : g.skip;
    const T sum = sum_row(de, n);
    dc[g.extra0] += sum;
    if (g.extra1 >= 0) dc[g.extra1] += sum;
    if (i < g.skip) return;
    de += g.skip;
    i -= g.skip;
  }
  const int64_t iy = i / g.w, ix = i % g.w, w = g.w;
  const int64_t* ry = g.rows + iy * g.h;
  const int64_t* rx = g.cols + ix * w;
  if (g.product) {
    std::fill(acc, acc + g.sy * w, T(0));
    for (int64_t jy = 0; jy < g.h; ++jy) {
      T* au = acc + ry[jy] * w;
      const T* dr = de + jy * w;
#pragma omp simd
      for (int64_t jx = 0; jx < w; ++jx) au[jx] += dr[jx];
    }
    for (int64_t u = 0; u < g.sy; ++u) {
      const T* au = acc + u * w;
      T* du = dc + u * g.sx;
      for (int64_t jx = 0; jx < w; ++jx) du[rx[jx]] += au[jx];
    }
  } else {
    std::fill(acc, acc + w, T(0));
    for (int64_t jy = 0; jy < g.h; ++jy) {
      const T* dr = de + jy * w;
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t jx = 0; jx < w; ++jx) {
        sum += dr[jx];
        acc[jx] += dr[jx];
      }
      dc[ry[jy]] += sum;
    }
    for (int64_t jx = 0; jx < w; ++jx) dc[g.col_offset + rx[jx]] += acc[jx];
  }
}

// The pairs of the term on queries (iRPE's r^Q, Eq. 16), seen from the key:
// f(j, x) for every key j and each bucket x of b(j, i) of the query i (two
// buckets in the cross method). `colv` is scratch of w entries.
template <typename F>
void visit_qterm_row(int64_t i, const Geometry& g, int64_t* colv, F&& f) {
  if (g.skip) {  // pairs with a token outside the grid: its bucket(s)
    const int64_t n = i < g.skip ? g.skip + g.h * g.w : g.skip;
    for (int64_t j = 0; j < n; ++j) {
      f(j, g.extra0);
      if (g.extra1 >= 0) f(j, g.extra1);
    }
    if (i < g.skip) return;
    i -= g.skip;
  }
  const int64_t iy = i / g.w, ix = i % g.w, w = g.w;
  for (int64_t jx = 0; jx < w; ++jx) colv[jx] = g.cols[jx * w + ix];
  for (int64_t jy = 0; jy < g.h; ++jy) {
    const int64_t u = g.rows[jy * g.h + iy], j0 = g.skip + jy * w;
    if (g.product) {
      for (int64_t jx = 0; jx < w; ++jx) f(j0 + jx, u * g.sx + colv[jx]);
    } else {
      for (int64_t jx = 0; jx < w; ++jx) {
        f(j0 + jx, u);
        f(j0 + jx, g.col_offset + colv[jx]);
      }
    }
  }
}

// s[j] += cq_j[b(j, i)] for the query i over all keys j, cq_j the row of
// the key j (`cq` + j * `stride`; stride 0: one row for every key, a bias
// table).
template <typename T>
void add_qterm_row(T* s, const T* cq, int64_t stride, int64_t i,
                   const Geometry& g, int64_t* colv) {
  visit_qterm_row(i, g, colv,
                  [&](int64_t j, int64_t x) { s[j] += cq[j * stride + x]; });
}

// Its adjoint: dcq_j[b(j, i)] += dE_ij (`dcq`: rows of `nb` entries, one
// per key).
template <typename T>
void reduce_qterm_row(const T* de, T* dcq, int64_t nb, int64_t i,
                      const Geometry& g, int64_t* colv) {
  visit_qterm_row(i, g, colv,
                  [&](int64_t j, int64_t x) { dcq[j * nb + x] += de[j]; });
}

// Query rows per block: R * L elements of about `block_elems` (two such
// blocks live in the backward), at least `min_rows` and at most L.
int64_t block_rows(int64_t length, int64_t block_elems, int64_t min_rows) {
  const int64_t r = std::max<int64_t>(min_rows, block_elems / std::max<int64_t>(length, 1));
  return std::max<int64_t>(1, std::min(r, length));
}

// The term's layout, as the Python side passes it: `layout` = {product (1
// or 0), sy, sx, col_offset, skip, extra0, extra1}.
Geometry geometry(const at::Tensor& rows, const at::Tensor& cols,
                  const std::vector<int64_t>& layout) {
  TORCH_CHECK(layout.size() == 7, "fused attention: layout has 7 entries");
  return {rows.data_ptr<int64_t>(), cols.data_ptr<int64_t>(), rows.size(0),
          cols.size(0), layout[1], layout[2], layout[0] != 0, layout[3],
          layout[4], layout[5], layout[6]};
}

// The terms of one call: per-query values of the term on keys (k), per-key
// values of the term on queries (q), both (B, H, L, buckets) views; and
// whether the bucket sums of the probabilities are wanted (the term on
// values: its output and table product are taken by the caller).
struct Terms {
  c10::optional<at::Tensor> k, q;
  bool sums;
};

void check_values(const at::Tensor& x, const at::Tensor& q,
                  const Geometry& g, int64_t nb) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1 && x.size(0) == q.size(0) &&
                  x.size(1) == q.size(1) && x.size(2) == q.size(2) &&
                  x.size(3) == nb && x.scalar_type() == q.scalar_type(),
              "fused attention: term values must be (B, H, L, buckets) in "
              "the dtype of q, last dim contiguous");
}

void check_inputs(const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v, const Terms& terms, int64_t nb,
                  const at::Tensor& rows, const at::Tensor& cols,
                  const c10::optional<at::Tensor>& mask, const Geometry& g) {
  TORCH_CHECK(q.device().is_cpu(), "fused attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "fused attention: q, k, v must be (B, H, L, d)");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() &&
                  q.scalar_type() == v.scalar_type(),
              "fused attention: q, k and v must share a dtype");
  const int64_t length = q.size(2);
  TORCH_CHECK(k.size(2) == length && v.size(2) == length &&
                  k.size(0) == q.size(0) && v.size(0) == q.size(0) &&
                  k.size(1) == q.size(1) && v.size(1) == q.size(1) &&
                  k.size(3) == q.size(3),
              "fused attention: q, k, v sizes disagree");
  TORCH_CHECK(rows.dim() == 2 && cols.dim() == 2 &&
                  rows.size(0) == rows.size(1) && cols.size(0) == cols.size(1) &&
                  g.skip >= 0 && g.skip + rows.size(0) * cols.size(0) == length,
              "fused attention: rows (h, h) and cols (w, w) with skip + h * w "
              "= L");
  TORCH_CHECK(rows.scalar_type() == at::kLong && cols.scalar_type() == at::kLong &&
                  rows.is_contiguous() && cols.is_contiguous(),
              "fused attention: contiguous int64 bucket tables");
  const int64_t spatial = g.product ? g.sy * g.sx : g.col_offset + g.sx;
  TORCH_CHECK(spatial <= nb && (g.product || g.sy <= g.col_offset) &&
                  (g.skip == 0 || (g.extra0 >= 0 && g.extra0 < nb &&
                                   g.extra1 < nb)),
              "fused attention: the layout reads buckets beyond the ", nb,
              " of the values");
  if (terms.k.has_value()) check_values(*terms.k, q, g, nb);
  if (terms.q.has_value()) check_values(*terms.q, q, g, nb);
  TORCH_CHECK(terms.k.has_value() || terms.q.has_value() || terms.sums,
              "fused attention: no relative term");
  const auto check_ids = [](const at::Tensor& t, int64_t n) {
    if (t.numel()) {
      TORCH_CHECK(t.min().item<int64_t>() >= 0 && t.max().item<int64_t>() < n,
                  "fused attention: bucket ids out of range");
    }
  };
  check_ids(rows, g.sy);
  check_ids(cols, g.sx);
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "fused attention: q, k, v need a contiguous last dim");
  if (mask.has_value()) {
    const auto& m = *mask;
    TORCH_CHECK(m.dim() == 4 && m.size(0) == q.size(0) &&
                    m.size(1) == q.size(1) && m.size(2) == length &&
                    m.size(3) == length && m.stride(3) == 1 &&
                    m.scalar_type() == q.scalar_type(),
                "fused attention: the mask must be (B, H, L, L) (broadcast "
                "views allowed), last dim contiguous, in the dtype of q");
  }
}

// The logits' additions of the query i: the term on keys (with the mask),
// the mask alone, the term on queries.
template <typename T>
struct RowTerms {
  Strided4<T> k, q, m;
  bool has_k, has_q, has_m;
  const Geometry* g;

  void add(T* s, int64_t b, int64_t hd, int64_t i, int64_t length, T* pat,
           int64_t* colv) const {
    const T* mr = has_m ? m.row(b, hd, i) : nullptr;
    if (has_k) {
      add_term_row<T>(s, k.row(b, hd, i), mr, i, *g, pat);
    } else if (mr) {
#pragma omp simd
      for (int64_t j = 0; j < length; ++j) s[j] += mr[j];
    }
    if (has_q) add_qterm_row<T>(s, q.row(b, hd, 0), q.si, i, *g, colv);
  }
};

template <typename T>
RowTerms<T> row_terms(const Terms& terms, const c10::optional<at::Tensor>& mask,
                      const Geometry& g) {
  const Strided4<T> none{nullptr, 0, 0, 0};
  return {terms.k ? strided4<T>(*terms.k) : none,
          terms.q ? strided4<T>(*terms.q) : none,
          mask ? strided4<T>(*mask) : none,
          terms.k.has_value(), terms.q.has_value(), mask.has_value(), &g};
}

int64_t pattern_size(const Geometry& g) {
  return std::max<int64_t>(1, g.product ? g.sy * g.w : g.w);
}

template <typename T>
void forward_impl(const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v, const c10::optional<at::Tensor>& mask,
                  const Terms& terms, const Geometry& g, int64_t block_elems,
                  int64_t min_rows, at::Tensor& out, at::Tensor& lse,
                  at::Tensor& sums) {
  const int64_t batch = q.size(0), heads = q.size(1), length = q.size(2);
  const int64_t rb = block_rows(length, block_elems, min_rows);
  const int64_t nblocks = (length + rb - 1) / rb;
  const RowTerms<T> rt = row_terms<T>(terms, mask, g);
  T* lse_p = lse.data_ptr<T>();
  T* sums_p = terms.sums ? sums.data_ptr<T>() : nullptr;
  const int64_t nb = terms.sums ? sums.size(3) : 0;
  at::parallel_for(0, batch * heads * nblocks, 1, [&](int64_t begin, int64_t end) {
    at::NoGradGuard no_grad;
    at::Tensor scratch = at::empty({rb, length}, q.options());
    std::vector<T> pat(pattern_size(g));
    std::vector<int64_t> colv(std::max<int64_t>(1, g.w));
    T* s = scratch.data_ptr<T>();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / nblocks, blk = task % nblocks;
      const int64_t b = bh / heads, hd = bh % heads;
      const int64_t r0 = blk * rb, r = std::min(rb, length - r0);
      at::Tensor logits = scratch.narrow(0, 0, r);
      at::mm_out(logits, q[b][hd].narrow(0, r0, r), k[b][hd].t());
      for (int64_t a = 0; a < r; ++a) {
        const int64_t i = r0 + a;
        T* sr = s + a * length;
        rt.add(sr, b, hd, i, length, pat.data(), colv.data());
        T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < length; ++j) mx = std::max(mx, sr[j]);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < length; ++j) {
          const T e = exp_impl(sr[j] - mx);
          sr[j] = e;
          sum += e;
        }
        const T inv = T(1) / sum;
#pragma omp simd
        for (int64_t j = 0; j < length; ++j) sr[j] *= inv;
        lse_p[bh * length + i] = mx + std::log(sum);
        if (sums_p) {  // the term on values: bucket sums of the row (Eq. 17)
          reduce_term_row<T>(sr, sums_p + (bh * length + i) * nb, i, g,
                             pat.data());
        }
      }
      at::Tensor o = out[b][hd].narrow(0, r0, r);
      at::mm_out(o, logits, v[b][hd]);
    }
  });
}

template <typename T>
void backward_impl(const at::Tensor& grad_out,
                   const c10::optional<at::Tensor>& grad_sums,
                   const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const at::Tensor& out,
                   const at::Tensor& lse,
                   const c10::optional<at::Tensor>& mask, const Terms& terms,
                   const Geometry& g, int64_t block_elems, int64_t min_rows,
                   at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                   at::Tensor& dvalues_k, at::Tensor& dvalues_q) {
  const int64_t batch = q.size(0), heads = q.size(1), length = q.size(2);
  const int64_t dim_v = v.size(3);
  const int64_t rb = block_rows(length, block_elems, min_rows);
  const RowTerms<T> rt = row_terms<T>(terms, mask, g);
  const bool has_gs = grad_sums.has_value();
  const Strided4<T> gs = has_gs ? strided4<T>(*grad_sums) : Strided4<T>{nullptr, 0, 0, 0};
  const T* lse_p = lse.data_ptr<T>();
  const int64_t nbk = terms.k ? dvalues_k.size(3) : 0;
  const int64_t nbq = terms.q ? dvalues_q.size(3) : 0;
  // dk, dv and the term on queries accumulate over the query blocks of one
  // (b, h): one task each
  at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    at::NoGradGuard no_grad;
    at::Tensor probs = at::empty({rb, length}, q.options());
    at::Tensor dprobs = at::empty({rb, length}, q.options());
    std::vector<T> pat(pattern_size(g));
    std::vector<int64_t> colv(std::max<int64_t>(1, g.w));
    T* p = probs.data_ptr<T>();
    T* dp = dprobs.data_ptr<T>();
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, hd = bh % heads;
      // one head's contiguous copies (heads split from a fused projection
      // are strided views, read slower by the block products): a task's
      // (L, D) buffers instead of copies of the whole q, k, v that would
      // live through the whole backward
      const at::Tensor qb = q[b][hd].contiguous(), kb = k[b][hd].contiguous(),
                       vb = v[b][hd].contiguous();
      const at::Tensor gob = grad_out[b][hd], ob = out[b][hd];
      at::Tensor dkb = dk[b][hd], dvb = dv[b][hd], dqb = dq[b][hd];
      T* dvk = terms.k ? dvalues_k[b][hd].data_ptr<T>() : nullptr;
      T* dvq = terms.q ? dvalues_q[b][hd].data_ptr<T>() : nullptr;
      for (int64_t r0 = 0; r0 < length; r0 += rb) {
        const int64_t r = std::min(rb, length - r0);
        at::Tensor pblk = probs.narrow(0, 0, r), dpblk = dprobs.narrow(0, 0, r);
        const at::Tensor go = gob.narrow(0, r0, r);
        at::mm_out(pblk, qb.narrow(0, r0, r), kb.t());
        for (int64_t a = 0; a < r; ++a) {
          const int64_t i = r0 + a;
          T* pr = p + a * length;
          rt.add(pr, b, hd, i, length, pat.data(), colv.data());
          const T l = lse_p[bh * length + i];
#pragma omp simd
          for (int64_t j = 0; j < length; ++j) pr[j] = exp_impl(pr[j] - l);
        }
        dvb.addmm_(pblk.t(), go);  // dv += P^T dO
        at::mm_out(dpblk, go, vb.t());  // dP = dO v^T
        const T* go_p = go.data_ptr<T>();
        const T* o_p = ob.narrow(0, r0, r).data_ptr<T>();
        const int64_t go_s = go.stride(0), o_s = ob.stride(0);
        for (int64_t a = 0; a < r; ++a) {
          const int64_t i = r0 + a;
          T* pr = p + a * length;
          T* dr = dp + a * length;
          T dot = 0;  // rowsum(dP * P)
          if (has_gs) {
            // the term on values: dP_ij += dL/dsums_i[b(i, j)]
            add_term_row<T>(dr, gs.row(b, hd, i), nullptr, i, g, pat.data());
#pragma omp simd reduction(+ : dot)
            for (int64_t j = 0; j < length; ++j) dot += pr[j] * dr[j];
          } else {  // = dO_i . O_i
            for (int64_t c = 0; c < dim_v; ++c) dot += go_p[a * go_s + c] * o_p[a * o_s + c];
          }
#pragma omp simd
          for (int64_t j = 0; j < length; ++j) dr[j] = pr[j] * (dr[j] - dot);
          if (dvk) reduce_term_row<T>(dr, dvk + i * nbk, i, g, pat.data());
          if (dvq) reduce_qterm_row<T>(dr, dvq, nbq, i, g, colv.data());
        }
        at::Tensor dqr = dqb.narrow(0, r0, r);
        at::mm_out(dqr, dpblk, kb);                    // dq = dE k
        dkb.addmm_(dpblk.t(), qb.narrow(0, r0, r));    // dk += dE^T q
      }
    }
  });
}

template <typename... Opt>
void detach_all(Opt&... xs) {
  ((xs = xs.has_value() ? c10::optional<at::Tensor>(xs->detach()) : xs), ...);
}

at::Tensor empty_like_or_none(const c10::optional<at::Tensor>& x,
                              const at::Tensor& like) {
  return x.has_value() ? at::zeros(x->sizes(), x->options())
                       : at::empty({0}, like.options());
}

std::vector<at::Tensor> fused_forward(at::Tensor q, at::Tensor k, at::Tensor v,
                                      c10::optional<at::Tensor> mask,
                                      c10::optional<at::Tensor> values_k,
                                      c10::optional<at::Tensor> values_q,
                                      bool with_sums, int64_t num_buckets,
                                      at::Tensor rows, at::Tensor cols,
                                      std::vector<int64_t> layout,
                                      int64_t block_elems, int64_t min_rows) {
  // the kernel is below autograd; intra-op worker threads do not inherit
  // the caller's grad mode, so the products see detached views only
  q = q.detach(), k = k.detach(), v = v.detach();
  detach_all(mask, values_k, values_q);
  const Geometry g = geometry(rows, cols, layout);
  const Terms terms{values_k, values_q, with_sums};
  check_inputs(q, k, v, terms, num_buckets, rows, cols, mask, g);
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  at::Tensor sums = with_sums
      ? at::zeros({q.size(0), q.size(1), q.size(2), num_buckets}, q.options())
      : at::empty({0}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "mmpe_fused_attention_forward", [&] {
    forward_impl<scalar_t>(q, k, v, mask, terms, g, block_elems, min_rows, out,
                           lse, sums);
  });
  return {out, lse, sums};
}

std::vector<at::Tensor> fused_backward(at::Tensor grad_out,
                                       c10::optional<at::Tensor> grad_sums,
                                       at::Tensor q, at::Tensor k,
                                       at::Tensor v, at::Tensor out,
                                       at::Tensor lse,
                                       c10::optional<at::Tensor> mask,
                                       c10::optional<at::Tensor> values_k,
                                       c10::optional<at::Tensor> values_q,
                                       int64_t num_buckets, at::Tensor rows,
                                       at::Tensor cols,
                                       std::vector<int64_t> layout,
                                       int64_t block_elems,
                                       int64_t min_rows) {
  q = q.detach(), k = k.detach(), v = v.detach();
  out = out.detach(), lse = lse.detach(), grad_out = grad_out.detach();
  detach_all(mask, values_k, values_q, grad_sums);
  const Geometry g = geometry(rows, cols, layout);
  const Terms terms{values_k, values_q, grad_sums.has_value()};
  check_inputs(q, k, v, terms, num_buckets, rows, cols, mask, g);
  TORCH_CHECK(grad_out.sizes() == out.sizes() && grad_out.stride(3) == 1 &&
                  out.is_contiguous() && lse.is_contiguous(),
              "fused attention backward: grad_out / out / lse layout");
  if (grad_sums.has_value()) check_values(*grad_sums, q, g, num_buckets);
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::zeros(k.sizes(), k.options());
  at::Tensor dv = at::zeros(v.sizes(), v.options());
  at::Tensor dvalues_k = empty_like_or_none(values_k, q);
  at::Tensor dvalues_q = empty_like_or_none(values_q, q);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "mmpe_fused_attention_backward", [&] {
    backward_impl<scalar_t>(grad_out, grad_sums, q, k, v, out, lse, mask,
                            terms, g, block_elems, min_rows, dq, dk, dv,
                            dvalues_k, dvalues_q);
  });
  return {dq, dk, dv, dvalues_k, dvalues_q};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "mmpe's fused CPU attention with per-axis relative terms";
  m.def("fused_forward", &fused_forward,
        "out, lse, sums = fused_forward(q, k, v, mask, values_k, values_q, "
        "with_sums, num_buckets, rows, cols, layout, block_elems, min_rows); "
        "layout = [product, sy, sx, col_offset, skip, extra0, extra1]");
  m.def("fused_backward", &fused_backward,
        "dq, dk, dv, dvalues_k, dvalues_q = fused_backward(grad_out, "
        "grad_sums, q, k, v, out, lse, mask, values_k, values_q, "
        "num_buckets, rows, cols, layout, block_elems, min_rows)");
}
