// The interface between the fused kernel's ATen part and its row loops.
//
// The row loops (the terms added to a block of logits, the softmax, the
// bucket sums and their adjoints: the kernel's time beside the matrix
// products) are compiled once per instruction set, each copy in its own
// namespace (kernel_rows_{baseline,avx2,avx512}.cpp), and called through the
// table `RowKernels` chosen by name at run time (kernel_variants.cpp),
// as ATen's CPU_CAPABILITY kernels are. This header declares data only:
// plain structs (no member functions, no inline code that one copy could
// emit with wider instructions for the others) and the tables' getters.
#pragma once

#include <cstdint>

namespace mmpe_rows {

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
};

// The logits' additions of a query row: the term on keys (per-query
// values), the mask, the term on queries (per-key values).
template <typename T>
struct RowTerms {
  Strided4<T> k, q, m;
  bool has_k, has_q, has_m;
  const Geometry* g;
};

// One block of `r` query rows from `r0` of the image b, head hd (bh = b *
// H + hd), L keys; `pat` (pattern_size) and `colv` (w) are scratch.
template <typename T>
struct Block {
  const RowTerms<T>* rt;
  int64_t b, hd, bh, r0, r, length;
  T* pat;
  int64_t* colv;
};

// The forward: `s` (r, L) holds q k^T on entry, the probabilities on exit;
// each row's log-sum-exp to lse[bh * L + i]; with `sums` (nb per row, rows
// of (bh, i)) the bucket sums of the probabilities (the term on values).
template <typename T>
struct ForwardRows {
  Block<T> blk;
  T* s;
  T* lse;
  T* sums;
  int64_t nb;
};

// The backward, first half: `p` (r, L) holds q k^T on entry, the
// probabilities recomputed from the saved log-sum-exp on exit.
template <typename T>
struct ProbRows {
  Block<T> blk;
  T* p;
  const T* lse;
};

// The backward, second half: `dp` (r, L) holds dO v^T on entry, dE = P *
// (dP - rowsum(dP * P)) on exit (with grad_sums: dP_ij += gs_i[b(i, j)]
// first, and the row sum taken over dP * P; else it is dO_i . O_i); the
// values' gradients accumulate into dvk (a row every dvk_s per query) and
// dvq (a row every dvq_s per key) of this (b, h) where not null. A row
// stride of 0 sums every query's (key's) gradient into one row: values
// shared by all queries (keys), a bias table, need no per-row buffer.
template <typename T>
struct GradRows {
  Block<T> blk;
  const T* p;
  T* dp;
  Strided4<T> gs;
  bool has_gs;
  const T* go;  // dO rows of the block, stride go_s
  const T* o;   // O rows of the block, stride o_s
  int64_t go_s, o_s, dim_v;
  T* dvk;
  T* dvq;
  int64_t dvk_s, dvq_s;
};

template <typename T>
struct RowKernels {
  void (*forward)(const ForwardRows<T>&);
  void (*probs)(const ProbRows<T>&);
  void (*grads)(const GradRows<T>&);
};

struct KernelTable {
  RowKernels<float> f32;
  RowKernels<double> f64;
};

// One table per compiled instruction set (x86-64: all three; elsewhere the
// baseline only).
namespace baseline { KernelTable table(); }
#if defined(__x86_64__) || defined(_M_X64)
#define MMPE_ROWS_X86 1
namespace avx2 { KernelTable table(); }
namespace avx512 { KernelTable table(); }
#endif

}  // namespace mmpe_rows
