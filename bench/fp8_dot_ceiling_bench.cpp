// What bounds FP8 weights at a few rows per expert on this core: the time of one 512-bit
// instruction (vdpbf16ps, vfmadd231ps, vpermi2b; twelve independent chains, so throughput, and
// one chain, so latency), the GF/s ceiling that vdpbf16ps alone sets (one per 32 weights and row,
// FP8 and BF16 weights alike), and the FP8 and BF16 dot kernels (forward of experts of 1-6 rows)
// on weights that stay in L2, one thread, as a fraction of that ceiling.
//
//   build/bench/fp8_dot_ceiling_bench [depth rows_of_weights reps]   (default: 2048 64 400)
//
// Needs AVX512-BF16 and AVX512-VBMI (the FP8 pair kernels' set); elsewhere it says so and exits.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "best_seconds.hpp"
#include "kernels/isa.hpp"
#include "kernels/micro_kernels.hpp"

using namespace grouplin::kernels;

namespace {

#if defined(__x86_64__) && defined(__GNUC__)
#define CEILING_TARGET __attribute__((target("avx512bf16,avx512vbmi,avx512bw,avx512f"), noinline))

enum class Op { Dot, Fma, Permute };

// `iters` rounds of `chains` independent 512-bit instructions of one kind; the empty asm makes
// one operand opaque each round, so that the compiler can neither fold nor hoist them.
template <Op kOp, int kChains>
CEILING_TARGET float run_chains(long iters) {
  float seed = 1.0f;
  asm volatile("" : "+x"(seed));
  __m512 acc[kChains];
  __m512i idx[kChains];
  for (int i = 0; i < kChains; ++i) {
    acc[i] = _mm512_set1_ps(seed * static_cast<float>(i));
    idx[i] = _mm512_set1_epi32(i);
  }
  __m512 y = _mm512_set1_ps(seed * 1e-9f);
  __m512i t = _mm512_set1_epi8(2);
  for (long n = 0; n < iters; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) {
      if constexpr (kOp == Op::Dot) {
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)idx[i], (__m512bh)y);
      } else if constexpr (kOp == Op::Fma) {
        acc[i] = _mm512_fmadd_ps(_mm512_castsi512_ps(idx[i]), y, acc[i]);
      } else {
        idx[i] = _mm512_permutex2var_epi8(t, idx[i], t);
      }
    }
    asm volatile("" : "+v"(y), "+v"(t));
  }
  // Through memory: GCC 12's reduce intrinsics read an undefined vector (-Wuninitialized).
  alignas(64) float lanes[16];
  alignas(64) int32_t words[16];
  float sum = 0;
  for (int i = 0; i < kChains; ++i) {
    _mm512_store_ps(lanes, acc[i]);
    _mm512_store_si512(words, idx[i]);
    sum += lanes[0] + static_cast<float>(words[0]);
  }
  return sum;
}

// Nanoseconds per instruction of `kChains` chains (best of 5).
template <Op kOp, int kChains>
double ns_per_instruction(float& sink) {
  constexpr long kIters = 4000000;
  const double s = best_seconds(5, [&] { sink += run_chains<kOp, kChains>(kIters); });
  return s * 1e9 / (static_cast<double>(kIters) * kChains);
}
#endif

}  // namespace

int main(int argc, char** argv) {
#if defined(__x86_64__) && defined(__GNUC__)
  const CpuFeatures cpu = detect_cpu();
  if (!cpu.avx512bf16 || !cpu.avx512vbmi) {
    std::printf("skipped: this CPU lacks AVX512-BF16 or AVX512-VBMI (%s)\n", describe(cpu).c_str());
    return 0;
  }
  const int64_t depth = argc > 1 ? std::atol(argv[1]) : 2048;
  const int nr = argc > 2 ? std::atoi(argv[2]) : 64;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 400;
  if (depth < 1 || nr < 1 || reps < 1) {
    std::fprintf(stderr, "fp8_dot_ceiling_bench: expected depth rows reps >= 1\n");
    return 2;
  }
  float sink = 0;
  const double dot = ns_per_instruction<Op::Dot, 12>(sink);
  std::printf("ns per 512-bit instruction, 12 independent chains (throughput):\n");
  std::printf("  vdpbf16ps %.3f  vfmadd231ps %.3f  vpermi2b %.3f\n", dot,
              ns_per_instruction<Op::Fma, 12>(sink), ns_per_instruction<Op::Permute, 12>(sink));
  std::printf("one chain (latency): vdpbf16ps %.3f ns\n", ns_per_instruction<Op::Dot, 1>(sink));
  // One vdpbf16ps per 32 weights and row is 64 FLOP, whatever the weights' dtype.
  const double ceiling = 64.0 / dot;
  std::printf("vdpbf16ps ceiling: %.1f GF/s per core\n\n", ceiling);

  const MicroKernels& mk = micro_kernels();
  if (mk.dot_tile_fp8_pairs == nullptr || mk.dot_tile_pairs == nullptr) {
    std::printf("skipped the kernels: the %s set has no FP8 pair kernels (GROUPLIN_ISA?)\n",
                mk.name);
    return 0;
  }
  std::vector<uint16_t> x(static_cast<size_t>(kPairDotRows * depth), 0x3f80);
  std::vector<uint16_t> w16(static_cast<size_t>(nr * depth));
  std::vector<uint8_t> codes(static_cast<size_t>(nr * depth));
  for (size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<uint8_t>((i * 37) % 251);
    if ((codes[i] & 0x7f) == 0x7f) codes[i] ^= 1;  // no NaN codes
    w16[i] = static_cast<uint16_t>(0x3c00 + i % 1021);
  }
  const int64_t blocks = (depth + kFp8Block - 1) / kFp8Block;
  std::vector<float> scales(static_cast<size_t>((nr + kFp8Block - 1) / kFp8Block * blocks), 1.0f);
  std::vector<float> c(static_cast<size_t>(kPairDotRows * nr));
  const Fp8Operand b{codes.data(), depth, scales.data(), blocks, 0, 0};
  std::printf("%s dot kernels, %d weight rows x depth %ld in L2, one thread, GF/s (of ceiling):\n",
              mk.name, nr, static_cast<long>(depth));
  std::printf("rows  FP8 weights        BF16 weights\n");
  for (int mr = 1; mr <= kPairDotRows; ++mr) {
    const double flops = 2.0 * mr * nr * static_cast<double>(depth) * reps;
    const double fp8 = best_seconds(5, [&] {
      for (int r = 0; r < reps; ++r)
        mk.dot_tile_fp8_pairs(mr, nr, depth, x.data(), depth, b, c.data(), nr);
    });
    const double bf16 = best_seconds(5, [&] {
      for (int r = 0; r < reps; ++r)
        mk.dot_tile_pairs(mr, nr, depth, x.data(), depth, w16.data(), depth, c.data(), nr);
    });
    std::printf("%4d  %6.1f (%3.0f%%)     %6.1f (%3.0f%%)\n", mr, flops / fp8 / 1e9,
                100 * flops / fp8 / 1e9 / ceiling, flops / bf16 / 1e9,
                100 * flops / bf16 / 1e9 / ceiling);
  }
  if (sink == 12345.0f) std::printf(" \n");  // keeps the chains' results alive
  return 0;
#else
  (void)argc;
  (void)argv;
  std::printf("skipped: x86-64 only (inline AVX-512 assembly)\n");
  return 0;
#endif
}
