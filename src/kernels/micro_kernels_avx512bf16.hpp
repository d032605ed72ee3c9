// Private to the AVX512-BF16 kernel set, whose kernels live in two files:
// micro_kernels_avx512bf16.cpp (pair_tile, pair_tile_scaled, dot_tile_pairs and the set's
// add_avx512bf16) and micro_kernels_avx512bf16_fp8.cpp (the FP8 pair kernels, which also need
// AVX512-VBMI: add_fp8_pairs). What both use: the vdpbf16ps step, A's pairs broadcast, the lane
// sum, the zero-padded load of a row's last bytes. Compiled natively and emulated, as
// x86_intrinsics.hpp says.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/micro_kernels.hpp"
#include "kernels/x86_intrinsics.hpp"

// The set's instructions (AVX512VL: pair_tile_half's 256-bit vdpbf16ps), and the same with
// AVX512-VBMI for the FP8 kernels: one list, because GCC inlines a helper below only into callers
// whose targets include all of its own. The helpers must inline (a few instructions each, in
// inner loops), so a caller that lacks a feature is a build error rather than a call per use
// (docs/PERFORMANCE.md, "The FP8 kernels' helpers inlined again").
#define GROUPLIN_AVX512BF16_FEATURES "avx512bf16,avx512vl,avx512bw,avx512f,avx2,fma"
#define GROUPLIN_AVX512BF16 GROUPLIN_TARGET(GROUPLIN_AVX512BF16_FEATURES)
#define GROUPLIN_AVX512BF16_VBMI GROUPLIN_TARGET(GROUPLIN_AVX512BF16_FEATURES ",avx512vbmi")
#define GROUPLIN_AVX512BF16_HELPER GROUPLIN_AVX512BF16 __attribute__((always_inline)) inline

namespace grouplin::kernels::GROUPLIN_X86_NS {

// The vdpbf16ps step on 16 lanes (dot_pairs) and on 8 (dot_pairs_half: the same per-lane sums).
#if defined(GROUPLIN_X86_EMULATED)
GROUPLIN_AVX512BF16_HELPER __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return emulated_dpbf16_ps(acc, a, b);
}
GROUPLIN_AVX512BF16_HELPER __m256 dot_pairs_half(__m256 acc, __m256i a, __m256i b) {
  return emulated_dpbf16_ps256(acc, a, b);
}
#else
GROUPLIN_AVX512BF16_HELPER __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
GROUPLIN_AVX512BF16_HELPER __m256 dot_pairs_half(__m256 acc, __m256i a, __m256i b) {
  return _mm256_dpbf16_ps(acc, (__m256bh)a, (__m256bh)b);
}
#endif

// The first n bytes at p (n <= 64; none when n <= 0), zeros after: the last, partial block of
// a row without reading past it. SIMDe has no masked byte load: the emulated build copies.
#if defined(GROUPLIN_X86_EMULATED)
GROUPLIN_AVX512BF16_HELPER __m512i load_first_bytes(const void* p, int64_t n) {
  alignas(64) uint8_t t[64] = {};
  if (n > 0) __builtin_memcpy(t, p, static_cast<size_t>(std::min<int64_t>(n, 64)));
  return _mm512_load_si512(t);
}
#else
GROUPLIN_AVX512BF16_HELPER __m512i load_first_bytes(const void* p, int64_t n) {
  const __mmask64 m = n >= 64 ? ~__mmask64{0} : n <= 0 ? 0 : (__mmask64{1} << n) - 1;
  return _mm512_maskz_loadu_epi8(m, p);
}
#endif

// The dword of A's pair row q of row a: depths 2q (low half) and 2q + 1; with `last_odd`, only
// depth 2q exists (the high half is +0 and nothing past it is read).
GROUPLIN_AVX512BF16_HELPER __m512i broadcast_pair(const uint16_t* a, int64_t q, bool last_odd) {
  uint32_t pair = a[2 * q];
  if (!last_odd) __builtin_memcpy(&pair, a + 2 * q, sizeof pair);
  return _mm512_set1_epi32(static_cast<int>(pair));
}

// One element of dot_tile_pairs from its 16 lane sums: lanes l and l + 8 added, then l and l + 4,
// l and l + 2, l and l + 1. GCC 12's avx512fintrin.h casts and extracts 256-bit halves from an
// undefined vector, which -Wuninitialized reports at every use: silenced here only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
GROUPLIN_AVX512BF16_HELPER float sum_pair_lanes(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
