// Which copies of the fused kernel's row loops this build has, which of
// them this CPU runs, and the table of one by name (see kernel_variants.h).
// Built for the baseline target, as the ATen part.
#include "kernel_variants.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

namespace mmpe_rows {
namespace {

// The row loops' copies: name, table, whether this CPU runs it. The
// probe asks the CPU (cpuid, and for AVX / AVX-512 whether the OS saves
// their registers: GCC's and Clang's __builtin_cpu_supports check both).
struct Variant {
  const char* name;
  KernelTable (*table)();
  bool (*runs)();
};

bool always() { return true; }
#ifdef MMPE_ROWS_X86
bool cpu_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}
bool cpu_avx512() {
  return cpu_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
}
#endif

const std::vector<Variant>& variants() {
  static const std::vector<Variant> all = {
      {"baseline", &baseline::table, &always},
#ifdef MMPE_ROWS_X86
      {"avx2", &avx2::table, &cpu_avx2},
      {"avx512", &avx512::table, &cpu_avx512},
#endif
  };
  return all;
}

// The tables, made once (the probe runs once per variant).
struct Resolved {
  std::string name;
  bool runs;
  KernelTable table;
};

const std::vector<Resolved>& resolved() {
  static const std::vector<Resolved> all = [] {
    std::vector<Resolved> out;
    for (const auto& v : variants()) out.push_back({v.name, v.runs(), v.table()});
    return out;
  }();
  return all;
}

}  // namespace

std::vector<std::string> compiled_isas() {
  std::vector<std::string> out;
  for (const auto& v : variants()) out.emplace_back(v.name);
  return out;
}

std::vector<std::string> runnable_isas() {
  std::vector<std::string> out;
  for (const auto& v : variants()) {
    if (v.runs()) out.emplace_back(v.name);
  }
  return out;
}

const KernelTable& kernel_table(const std::string& isa) {
  std::string names;
  for (const auto& r : resolved()) {
    if (r.name == isa) {
      TORCH_CHECK(r.runs, "fused attention: this CPU cannot run the '", isa,
                  "' kernel variant (it runs: ", c10::Join(", ", runnable_isas()),
                  ")");
      return r.table;
    }
    names += (names.empty() ? "" : ", ") + r.name;
  }
  TORCH_CHECK(false, "fused attention: unknown kernel variant '", isa,
              "'; this build has: ", names);
}

}  // namespace mmpe_rows
