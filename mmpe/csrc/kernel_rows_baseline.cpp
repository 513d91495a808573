// The fused kernel's row loops for any CPU: the compiler's default target
// (x86-64: SSE2; aarch64: NEON). See kernel_rows_impl.h.
#define MMPE_ROWS_ISA baseline
#include "kernel_rows_impl.h"
