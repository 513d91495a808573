// The fused kernel's row loops, compiled once per instruction set: a
// kernel_rows_<isa>.cpp sets the target (#pragma GCC target) and defines
// MMPE_ROWS_ISA, the namespace of its copy, before including this file.
//
// Everything here has internal linkage (an unnamed namespace) except the
// copy's `table()`, and the file includes nothing with inline code: no
// function of a copy built for wider instructions can stand in for one of
// the baseline's at link time. Hence the builtins (floor, exp, log) and no
// standard library calls.
//
// The terms (iRPE, Wu et al., ICCV 2021, Eq. 16-17; see
// fused_attention_cpu.cpp): on keys T_ij = c_i[u * Sx + v] (product) or
// c_i[u] + c_i[o + v] (cross) with u = ry(iy, jy), v = rx(ix, jx); on
// queries U_ij = c'_j[b(j, i)]; on values the bucket sums s_i of the
// probabilities; pairs with a leading token use the extra bucket(s).
#include "kernel_rows.h"

#ifndef MMPE_ROWS_ISA
#error "define MMPE_ROWS_ISA (the copy's namespace) before including this file"
#endif

namespace mmpe_rows {
namespace MMPE_ROWS_ISA {
namespace {

template <typename T>
inline T max_of(T a, T b) { return a < b ? b : a; }  // std::max's order
template <typename T>
inline T min_of(T a, T b) { return b < a ? b : a; }

inline float log_of(float x) { return __builtin_logf(x); }
inline double log_of(double x) { return __builtin_log(x); }

// floor(t) for |t| < 2^31 in a form the vectoriser takes: a round
// instruction where the target has one (SSE4.1 and up, NEON); for x86-64's
// baseline (SSE2) truncation and a correction, the same value.
inline float floor_of(float t) {
#if defined(MMPE_ROWS_HAS_ROUND) || !(defined(__x86_64__) || defined(_M_X64))
  return __builtin_floorf(t);
#else
  const float tr = static_cast<float>(static_cast<int32_t>(t));
  return tr > t ? tr - 1.0f : tr;
#endif
}

// exp(x) for float, Cephes' expf (range reduction by ln 2, degree-6
// polynomial, about 1 ulp), written so that the loops calling it vectorise;
// exp(-inf) = 0 (masked keys), NaN stays NaN.
inline float exp_of(float x) {
  const float lo = -87.3365447f;  // below: 0 (a denormal or 0 in expf too)
  const float hi = 88.7228394f;
  const float xc = min_of(max_of(x, lo), hi);
  const float n = floor_of(xc * 1.44269504088896341f + 0.5f);
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
      p * __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
  // NaN in, NaN out (a fully masked row, as the explicit backend gives)
  return x < lo ? 0.0f : (x == x ? y : x);
}

inline double exp_of(double x) { return __builtin_exp(x); }

template <typename T>
inline const T* row_of(const Strided4<T>& t, int64_t b, int64_t hd,
                       int64_t i) {
  return t.data + b * t.sb + hd * t.sh + i * t.si;
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
    for (int64_t x = 0; x < g.sy * w; ++x) acc[x] = T(0);
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
    for (int64_t x = 0; x < w; ++x) acc[x] = T(0);
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

// The term on queries (iRPE's r^Q, Eq. 16), seen from the key: for every
// key j and each bucket x of b(j, i) of the query i (two buckets in the
// cross method), s[j] += cq[j * stride + x] (ADJOINT false; stride 0: one
// row for every key, a bias table) or its adjoint cq[j * stride + x] +=
// s[j] (ADJOINT true: the values' gradient, rows of `stride` per key).
// `colv` is scratch of w entries.
template <bool ADJOINT, typename T, typename C>
void qterm_row(T* s, C* cq, int64_t stride, int64_t i, const Geometry& g,
               int64_t* colv) {
  const auto visit = [&](int64_t j, int64_t x) {
    if constexpr (ADJOINT) {
      cq[j * stride + x] += s[j];
    } else {
      s[j] += cq[j * stride + x];
    }
  };
  if (g.skip) {  // pairs with a token outside the grid: its bucket(s)
    const int64_t n = i < g.skip ? g.skip + g.h * g.w : g.skip;
    for (int64_t j = 0; j < n; ++j) {
      visit(j, g.extra0);
      if (g.extra1 >= 0) visit(j, g.extra1);
    }
    if (i < g.skip) return;
    i -= g.skip;
  }
  const int64_t iy = i / g.w, ix = i % g.w, w = g.w;
  for (int64_t jx = 0; jx < w; ++jx) colv[jx] = g.cols[jx * w + ix];
  for (int64_t jy = 0; jy < g.h; ++jy) {
    const int64_t u = g.rows[jy * g.h + iy], j0 = g.skip + jy * w;
    if (g.product) {
      for (int64_t jx = 0; jx < w; ++jx) visit(j0 + jx, u * g.sx + colv[jx]);
    } else {
      for (int64_t jx = 0; jx < w; ++jx) {
        visit(j0 + jx, u);
        visit(j0 + jx, g.col_offset + colv[jx]);
      }
    }
  }
}

// The logits' additions of the query i: the term on keys (with the mask),
// the mask alone, the term on queries.
template <typename T>
void add_terms(const Block<T>& k, T* s, int64_t i) {
  const RowTerms<T>& rt = *k.rt;
  const T* mr = rt.has_m ? row_of(rt.m, k.b, k.hd, i) : nullptr;
  if (rt.has_k) {
    add_term_row<T>(s, row_of(rt.k, k.b, k.hd, i), mr, i, *rt.g, k.pat);
  } else if (mr) {
#pragma omp simd
    for (int64_t j = 0; j < k.length; ++j) s[j] += mr[j];
  }
  if (rt.has_q) {
    qterm_row<false>(s, row_of(rt.q, k.b, k.hd, 0), rt.q.si, i, *rt.g,
                     k.colv);
  }
}

template <typename T>
void forward_rows(const ForwardRows<T>& a) {
  const Block<T>& k = a.blk;
  const int64_t length = k.length;
  for (int64_t x = 0; x < k.r; ++x) {
    const int64_t i = k.r0 + x;
    T* sr = a.s + x * length;
    add_terms(k, sr, i);
    T mx = -__builtin_inf();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < length; ++j) mx = max_of(mx, sr[j]);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < length; ++j) {
      const T e = exp_of(sr[j] - mx);
      sr[j] = e;
      sum += e;
    }
    const T inv = T(1) / sum;
#pragma omp simd
    for (int64_t j = 0; j < length; ++j) sr[j] *= inv;
    a.lse[k.bh * length + i] = mx + log_of(sum);
    if (a.sums) {  // the term on values: bucket sums of the row (Eq. 17)
      reduce_term_row<T>(sr, a.sums + (k.bh * length + i) * a.nb, i,
                         *k.rt->g, k.pat);
    }
  }
}

template <typename T>
void prob_rows(const ProbRows<T>& a) {
  const Block<T>& k = a.blk;
  const int64_t length = k.length;
  for (int64_t x = 0; x < k.r; ++x) {
    const int64_t i = k.r0 + x;
    T* pr = a.p + x * length;
    add_terms(k, pr, i);
    const T l = a.lse[k.bh * length + i];
#pragma omp simd
    for (int64_t j = 0; j < length; ++j) pr[j] = exp_of(pr[j] - l);
  }
}

template <typename T>
void grad_rows(const GradRows<T>& a) {
  const Block<T>& k = a.blk;
  const Geometry& g = *k.rt->g;
  const int64_t length = k.length;
  for (int64_t x = 0; x < k.r; ++x) {
    const int64_t i = k.r0 + x;
    const T* pr = a.p + x * length;
    T* dr = a.dp + x * length;
    T dot = 0;  // rowsum(dP * P)
    if (a.has_gs) {
      // the term on values: dP_ij += dL/dsums_i[b(i, j)]
      add_term_row<T>(dr, row_of(a.gs, k.b, k.hd, i), nullptr, i, g, k.pat);
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < length; ++j) dot += pr[j] * dr[j];
    } else {  // = dO_i . O_i
      const T* go = a.go + x * a.go_s;
      const T* o = a.o + x * a.o_s;
      for (int64_t c = 0; c < a.dim_v; ++c) dot += go[c] * o[c];
    }
#pragma omp simd
    for (int64_t j = 0; j < length; ++j) dr[j] = pr[j] * (dr[j] - dot);
    if (a.dvk) reduce_term_row<T>(dr, a.dvk + i * a.dvk_s, i, g, k.pat);
    if (a.dvq) qterm_row<true>(dr, a.dvq, a.dvq_s, i, g, k.colv);
  }
}

template <typename T>
RowKernels<T> kernels() {
  return {&forward_rows<T>, &prob_rows<T>, &grad_rows<T>};
}

}  // namespace

KernelTable table() { return {kernels<float>(), kernels<double>()}; }

}  // namespace MMPE_ROWS_ISA
}  // namespace mmpe_rows
