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
//
// The row loops (kernel_rows_impl.h) are compiled once per instruction set
// (baseline, AVX2 + FMA, AVX-512) and called through the table of the
// variant named by each call's `isa` (kernel_variants.cpp; the Python side
// picks one per process from the CPU's features or MMPE_KERNEL_ISA): one
// build runs on every x86-64 CPU. This file itself is built for the baseline
// target: ATen's inline code is never emitted with wider instructions.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernel_rows.h"
#include "kernel_variants.h"

namespace {

using mmpe_rows::Geometry;
using mmpe_rows::kernel_table;
using mmpe_rows::RowKernels;
using mmpe_rows::RowTerms;
using mmpe_rows::Strided4;

// The row loops of the dtype T in a variant's table.
template <typename T>
const RowKernels<T>& row_kernels(const mmpe_rows::KernelTable& t);
template <>
const RowKernels<float>& row_kernels<float>(const mmpe_rows::KernelTable& t) {
  return t.f32;
}
template <>
const RowKernels<double>& row_kernels<double>(const mmpe_rows::KernelTable& t) {
  return t.f64;
}

// ------------------------------------------------------------ ATen part
template <typename T>
Strided4<T> strided4(const at::Tensor& t) {
  return {t.data_ptr<T>(), t.stride(0), t.stride(1), t.stride(2)};
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

// The dtype the kernel computes in for q, k, v of `t`: float32 for bfloat16
// and float16 (their sums and softmax statistics need its range and
// precision), else their own.
at::ScalarType compute_type(at::ScalarType t) {
  return t == at::kBFloat16 || t == at::kHalf ? at::kFloat : t;
}

void check_values(const at::Tensor& x, const at::Tensor& q,
                  const Geometry& g, int64_t nb) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1 && x.size(0) == q.size(0) &&
                  x.size(1) == q.size(1) && x.size(2) == q.size(2) &&
                  x.size(3) == nb &&
                  x.scalar_type() == compute_type(q.scalar_type()),
              "fused attention: term values must be (B, H, L, buckets) in "
              "the compute dtype of q (float32 for bfloat16 / float16), last "
              "dim contiguous");
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
                    m.scalar_type() == compute_type(q.scalar_type()),
                "fused attention: the mask must be (B, H, L, L) (broadcast "
                "views allowed), last dim contiguous, in the compute dtype of "
                "q");
  }
}

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
void forward_impl(const RowKernels<T>& kern, const at::Tensor& q,
                  const at::Tensor& k, const at::Tensor& v,
                  const c10::optional<at::Tensor>& mask, const Terms& terms,
                  const Geometry& g, int64_t block_elems, int64_t min_rows,
                  at::Tensor& out, at::Tensor& lse, at::Tensor& sums) {
  const int64_t batch = q.size(0), heads = q.size(1), length = q.size(2);
  const int64_t rb = block_rows(length, block_elems, min_rows);
  const int64_t nblocks = (length + rb - 1) / rb;
  const RowTerms<T> rt = row_terms<T>(terms, mask, g);
  T* lse_p = lse.data_ptr<T>();
  T* sums_p = terms.sums ? sums.data_ptr<T>() : nullptr;
  const int64_t nb = terms.sums ? sums.size(3) : 0;
  const at::ScalarType ct = lse.scalar_type();
  const bool direct = out.scalar_type() == ct;
  at::parallel_for(0, batch * heads * nblocks, 1, [&](int64_t begin, int64_t end) {
    at::NoGradGuard no_grad;
    at::Tensor scratch = at::empty({rb, length}, lse.options());
    at::Tensor oscratch = direct ? at::Tensor() : at::empty({rb, v.size(3)}, lse.options());
    std::vector<T> pat(pattern_size(g));
    std::vector<int64_t> colv(std::max<int64_t>(1, g.w));
    T* s = scratch.data_ptr<T>();
    // one head's contiguous copies in the compute dtype, made when a task
    // reaches a new head (a task's blocks are consecutive): heads split
    // from a fused projection are strided views, read slower by the block
    // products, and copies of the whole q, k, v (float32 ones of bfloat16
    // inputs) would add three activations to the peak
    int64_t cur = -1;
    at::Tensor qh, kh, vh;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / nblocks, blk = task % nblocks;
      const int64_t b = bh / heads, hd = bh % heads;
      if (bh != cur) {
        qh = q[b][hd].to(ct).contiguous();
        kh = k[b][hd].to(ct).contiguous();
        vh = v[b][hd].to(ct).contiguous();
        cur = bh;
      }
      const int64_t r0 = blk * rb, r = std::min(rb, length - r0);
      at::Tensor logits = scratch.narrow(0, 0, r);
      at::mm_out(logits, qh.narrow(0, r0, r), kh.t());
      // the terms, the mask, the softmax, the bucket sums: the row loops
      kern.forward({{&rt, b, hd, bh, r0, r, length, pat.data(), colv.data()},
                    s, lse_p, sums_p, nb});
      at::Tensor o = out[b][hd].narrow(0, r0, r);
      if (direct) {
        at::mm_out(o, logits, vh);
      } else {  // bfloat16 / float16: float32 sums, rounded once
        at::Tensor ob = oscratch.narrow(0, 0, r);
        at::mm_out(ob, logits, vh);
        o.copy_(ob);
      }
    }
  });
}

// The zeroed gradient buffer of term values `x` (B, H, L, nb) (an empty
// tensor without them): one row per (b, h) where the values are shared by
// every query (every key, a term on queries; stride 0 along L: a bias
// table, the offset biases), so that the backward holds B H nb floats for
// them instead of B H L nb (the row loops sum the rows into it); else one
// row per query (key). Per (b, h), not fewer: the backward's tasks are
// (b, h) pairs run in parallel. The caller reduces it to the values' shape.
at::Tensor grad_buffer(const c10::optional<at::Tensor>& x,
                       const at::Tensor& like) {
  if (!x.has_value()) return at::empty({0}, like.options());
  const int64_t rows = x->stride(2) == 0 ? 1 : x->size(2);
  return at::zeros({x->size(0), x->size(1), rows, x->size(3)}, x->options());
}

// The row stride of a gradient buffer (grad_buffer) of `length` rows: 0
// for the one shared row.
int64_t grad_row_stride(const at::Tensor& d, int64_t length) {
  return d.size(2) == length ? d.stride(2) : 0;
}

template <typename T>
void backward_impl(const RowKernels<T>& kern, const at::Tensor& grad_out,
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
  // the gradients' row strides: 0 where the values are shared by the
  // queries (keys), whose gradient is then one row per (b, h)
  const int64_t dvk_s = terms.k ? grad_row_stride(dvalues_k, length) : 0;
  const int64_t dvq_s = terms.q ? grad_row_stride(dvalues_q, length) : 0;
  // dk, dv and the term on queries accumulate over the query blocks of one
  // (b, h): one task each
  at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    at::NoGradGuard no_grad;
    at::Tensor probs = at::empty({rb, length}, lse.options());
    at::Tensor dprobs = at::empty({rb, length}, lse.options());
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
      // (bfloat16 / float16 inputs: the head's float32 copies)
      const at::ScalarType ct = lse.scalar_type();
      const at::Tensor qb = q[b][hd].to(ct).contiguous(),
                       kb = k[b][hd].to(ct).contiguous(),
                       vb = v[b][hd].to(ct).contiguous();
      const at::Tensor gob = grad_out[b][hd].to(ct), ob = out[b][hd].to(ct);
      // bfloat16 / float16: the head's gradients accumulate in float32
      // buffers of the task, rounded into the outputs when the head is done
      const bool direct = dq.scalar_type() == ct;
      at::Tensor dkb = direct ? dk[b][hd] : at::zeros_like(qb),
                 dvb = direct ? dv[b][hd] : at::zeros_like(vb),
                 dqb = direct ? dq[b][hd] : at::empty_like(qb);
      T* dvk = terms.k ? dvalues_k[b][hd].data_ptr<T>() : nullptr;
      T* dvq = terms.q ? dvalues_q[b][hd].data_ptr<T>() : nullptr;
      for (int64_t r0 = 0; r0 < length; r0 += rb) {
        const int64_t r = std::min(rb, length - r0);
        const mmpe_rows::Block<T> blk{&rt, b, hd, bh, r0, r, length,
                                      pat.data(), colv.data()};
        at::Tensor pblk = probs.narrow(0, 0, r), dpblk = dprobs.narrow(0, 0, r);
        const at::Tensor go = gob.narrow(0, r0, r);
        at::mm_out(pblk, qb.narrow(0, r0, r), kb.t());
        kern.probs({blk, p, lse_p});  // P from the saved log-sum-exp
        dvb.addmm_(pblk.t(), go);  // dv += P^T dO
        at::mm_out(dpblk, go, vb.t());  // dP = dO v^T
        const at::Tensor ob_r = ob.narrow(0, r0, r);
        // dE = P * (dP - rowsum(dP * P)) and the values' gradients
        kern.grads({blk, p, dp, gs, has_gs, go.data_ptr<T>(),
                    ob_r.data_ptr<T>(), go.stride(0), ob.stride(0), dim_v,
                    dvk, dvq, dvk_s, dvq_s});
        at::Tensor dqr = dqb.narrow(0, r0, r);
        at::mm_out(dqr, dpblk, kb);                    // dq = dE k
        dkb.addmm_(dpblk.t(), qb.narrow(0, r0, r));    // dk += dE^T q
      }
      if (!direct) {
        dq[b][hd].copy_(dqb), dk[b][hd].copy_(dkb), dv[b][hd].copy_(dvb);
      }
    }
  });
}

template <typename... Opt>
void detach_all(Opt&... xs) {
  ((xs = xs.has_value() ? c10::optional<at::Tensor>(xs->detach()) : xs), ...);
}


std::vector<at::Tensor> fused_forward(at::Tensor q, at::Tensor k, at::Tensor v,
                                      c10::optional<at::Tensor> mask,
                                      c10::optional<at::Tensor> values_k,
                                      c10::optional<at::Tensor> values_q,
                                      bool with_sums, int64_t num_buckets,
                                      at::Tensor rows, at::Tensor cols,
                                      std::vector<int64_t> layout,
                                      int64_t block_elems, int64_t min_rows,
                                      const std::string& isa) {
  const mmpe_rows::KernelTable& table = kernel_table(isa);
  // the kernel is below autograd; intra-op worker threads do not inherit
  // the caller's grad mode, so the products see detached views only
  q = q.detach(), k = k.detach(), v = v.detach();
  detach_all(mask, values_k, values_q);
  const Geometry g = geometry(rows, cols, layout);
  const Terms terms{values_k, values_q, with_sums};
  check_inputs(q, k, v, terms, num_buckets, rows, cols, mask, g);
  // bfloat16 / float16 q, k, v: float32 arithmetic, log-sum-exp and bucket
  // sums; the output in the input dtype
  const at::ScalarType ct = compute_type(q.scalar_type());
  const at::TensorOptions copts = q.options().dtype(ct);
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, copts);
  at::Tensor sums = with_sums
      ? at::zeros({q.size(0), q.size(1), q.size(2), num_buckets}, copts)
      : at::empty({0}, copts);
  AT_DISPATCH_FLOATING_TYPES(ct, "mmpe_fused_attention_forward", [&] {
    forward_impl<scalar_t>(row_kernels<scalar_t>(table), q, k, v, mask, terms, g, block_elems, min_rows, out,
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
                                       int64_t min_rows,
                                       const std::string& isa) {
  const mmpe_rows::KernelTable& table = kernel_table(isa);
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
  // bfloat16 / float16: float32 arithmetic and accumulators (per head), the
  // gradients of q, k, v in their dtype
  const at::ScalarType ct = compute_type(q.scalar_type());
  TORCH_CHECK(out.scalar_type() == q.scalar_type() &&
                  grad_out.scalar_type() == q.scalar_type() &&
                  lse.scalar_type() == ct,
              "fused attention backward: out and grad_out in the dtype of q, "
              "lse in its compute dtype");
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::zeros(k.sizes(), k.options());
  at::Tensor dv = at::zeros(v.sizes(), v.options());
  at::Tensor dvalues_k = grad_buffer(values_k, q);
  at::Tensor dvalues_q = grad_buffer(values_q, q);
  AT_DISPATCH_FLOATING_TYPES(ct, "mmpe_fused_attention_backward", [&] {
    backward_impl<scalar_t>(row_kernels<scalar_t>(table), grad_out, grad_sums, q, k, v, out, lse, mask,
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
        "with_sums, num_buckets, rows, cols, layout, block_elems, min_rows, "
        "isa); layout = [product, sy, sx, col_offset, skip, extra0, extra1]");
  m.def("fused_backward", &fused_backward,
        "dq, dk, dv, dvalues_k, dvalues_q = fused_backward(grad_out, "
        "grad_sums, q, k, v, out, lse, mask, values_k, values_q, "
        "num_buckets, rows, cols, layout, block_elems, min_rows, isa)");
  m.def("compiled_isas", &mmpe_rows::compiled_isas,
        "the row loops' variants in this build, narrowest first");
  m.def("runnable_isas", &mmpe_rows::runnable_isas,
        "the compiled variants this CPU runs (cpuid and OS support), "
        "narrowest first");
}
