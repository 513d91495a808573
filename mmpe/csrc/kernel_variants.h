// The fused kernel's instruction-set variants, chosen by name at run time.
//
// The row loops (kernel_rows_impl.h) are compiled once per instruction set
// (kernel_rows_{baseline,avx2,avx512}.cpp); kernel_variants.cpp lists the
// copies this build has, asks the CPU which of them it runs, and gives the
// table of one by name (the Python side picks the name once per process from
// runnable_isas() or MMPE_KERNEL_ISA), as ATen's CPU_CAPABILITY kernels are.
#pragma once

#include <string>
#include <vector>

#include "kernel_rows.h"

namespace mmpe_rows {

// The table of the variant `isa`; an error (never an illegal instruction)
// for a name this build lacks or a variant this CPU cannot run.
const KernelTable& kernel_table(const std::string& isa);

// The row loops' variants in this build, narrowest first.
std::vector<std::string> compiled_isas();

// The compiled variants this CPU runs (cpuid and OS support), narrowest
// first.
std::vector<std::string> runnable_isas();

}  // namespace mmpe_rows
