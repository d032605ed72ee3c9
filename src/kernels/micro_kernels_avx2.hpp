// Private to the AVX2+FMA kernel set, whose kernels live in two files: micro_kernels_avx2.cpp
// (F32 and BF16, data movement, the set's table) and micro_kernels_avx2_fp8.cpp (FP8 weights).
// Each function is compiled for AVX2+FMA by GROUPLIN_AVX2; the rest of the library stays baseline
// x86-64.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/micro_kernels.hpp"

#define GROUPLIN_AVX2 __attribute__((target("avx2,fma")))

namespace grouplin::kernels::native {

// (l0 + l4) + (l2 + l6) + ((l1 + l5) + (l3 + l7)): the tree dot_tile_portable spells out.
GROUPLIN_AVX2 inline float sum_lanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // l_i + l_i+4
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                         // + l_i+2
  s = _mm_add_ss(s, _mm_movehdup_ps(s));                                          // + l_i+1
  return _mm_cvtss_f32(s);
}

// Mask for the first `n` (< 8) lanes.
GROUPLIN_AVX2 inline __m256i first_lanes(int64_t n) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), index);
}

// The end of a dot tile: the masked last step's fused multiply-adds (when bv is given: the
// first lanes of B from column k on, zero beyond), then each accumulator's lanes summed in
// sum_lanes's tree and added to c.
template <int MR, int NR>
GROUPLIN_AVX2 inline void dot_tail_and_sums(const float* a, int64_t lda, int64_t k, __m256i mask,
                                            const __m256* bv, __m256 (*acc)[NR], float* c,
                                            int64_t ldc) {
  if (bv != nullptr) {
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_maskload_ps(a + i * lda + k, mask);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) c[i * ldc + j] += sum_lanes(acc[i][j]);
  }
}

// The FP8 entries of the set (micro_kernels_avx2_fp8.cpp), as MicroKernels documents them.
void decode_e4m3_avx2(const uint8_t* src, float scale, float* dst, int64_t n);
void dot_tile_fp8_avx2(int mr, int nr, int64_t kc, const float* a, int64_t lda, const Fp8Operand& b,
                       float* c, int64_t ldc);
void fma_rows_fp8_avx2(int64_t rows, int64_t depth, const float* a, int64_t lda,
                       const Fp8Operand& b, int64_t cols, float* c, int64_t ldc);

}  // namespace grouplin::kernels::native
