// The dispatch point of the kernel sets (micro_kernels.hpp): the best set for this CPU and
// GROUPLIN_ISA, chosen once per process, and the switches the tests use. The sets themselves live
// one per file: micro_kernels_portable.cpp, and on x86-64 micro_kernels_avx2.cpp,
// micro_kernels_avx512.cpp, micro_kernels_avx512bf16.cpp and micro_kernels_amx.cpp.
#include "kernels/micro_kernels.hpp"

#include <atomic>

#include "kernels/isa.hpp"
#include "kernels/micro_kernels_x86.hpp"

namespace grouplin::kernels {
namespace {

#if defined(__x86_64__)

// The AVX-512 sets: the AVX2 set with the arithmetic the wider registers speed up replaced (the
// data movement and the memory-bound dot tiles stay AVX2's).
struct X86Sets {
  MicroKernels avx512, avx512bf16, amx;
};
const X86Sets& x86_sets() {
  static const X86Sets sets = [] {
    const MicroKernels& avx2 = native::avx2_set();
    X86Sets s{avx2, avx2, avx2};
    native::add_avx512(s.avx512);
    s.avx512bf16 = s.avx512;
    native::add_avx512bf16(s.avx512bf16);
    if (detect_cpu().avx512vbmi) native::add_fp8_pairs(s.avx512bf16);
    s.amx = s.avx512bf16;
    native::add_amx(s.amx);
    return s;
  }();
  return sets;
}

#endif  // defined(__x86_64__)

const MicroKernels* best_for_cpu() {
#if defined(__x86_64__)
  switch (kernel_isa()) {
    case Isa::Amx:
      return &x86_sets().amx;
    case Isa::Avx512Bf16:
      return &x86_sets().avx512bf16;
    case Isa::Avx512:
      return &x86_sets().avx512;
    case Isa::Avx2:
      return &native::avx2_set();
    case Isa::Portable:
      break;
  }
#endif
  return &portable_kernels();
}

std::atomic<const MicroKernels*> g_forced{nullptr};

}  // namespace

const MicroKernels& micro_kernels() {
  static const MicroKernels* const best = best_for_cpu();
  const MicroKernels* forced = g_forced.load(std::memory_order_relaxed);
  return forced != nullptr ? *forced : *best;
}

void force_portable_kernels(bool portable) {
  g_forced.store(portable ? &portable_kernels() : nullptr, std::memory_order_relaxed);
}

void force_kernels(const MicroKernels* set) { g_forced.store(set, std::memory_order_relaxed); }

const MicroKernels* avx2_kernels() {
#if defined(__x86_64__)
  if (best_isa(detect_cpu()) >= Isa::Avx2) return &native::avx2_set();
#endif
  return nullptr;
}

}  // namespace grouplin::kernels
