// The fused kernel's row loops for x86-64 CPUs with AVX-512 F, BW, VL and DQ
// (chosen at run time when the CPU has them; see kernel_variants.cpp).
// The target covers every function of this file only: it includes no inline
// code from other headers (kernel_rows_impl.h).
#include "kernel_rows.h"  // before the target: <cstdint> stays baseline
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(                                         \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif
#define MMPE_ROWS_HAS_ROUND 1  // SSE4.1 roundps under the target
#define MMPE_ROWS_ISA avx512
#include "kernel_rows_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
