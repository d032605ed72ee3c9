// The AVX512-BF16 kernel set (x86-64 builds; see micro_kernels_x86.hpp): the AVX-512F set plus
// pair_tile, BF16 x BF16 products by vdpbf16ps. Each instruction multiplies, per 32-bit lane, one
// pair of BF16 values of A (broadcast: two adjacent depths of one row of x or dy, read in place)
// by the pair of B (the same two depths of one column, from a pair panel) and adds both products
// to the lane's F32 sum: the operands stay BF16 (half the bytes of widened ones through the
// registers) and one instruction does two multiply-adds per lane. The register tile is the F32
// set's: 6 rows x 4 strips of 16 columns, 24 zmm sums. dot_tile_pairs, for forward of experts
// with 1-6 rows, reads x's and the weights' rows along the depth, as they lie, one weight row at
// a time (one memory stream), and sums each element in four chains of 16 lanes: one load and one
// vdpbf16ps per 32 weights (1.4-2.8x the transposing kernel it replaced at 1-3 rows per expert,
// 2 threads of a Zen 4; tile_compute.hpp).
//
// Each element's sum of pair_tile is one chain of vdpbf16ps over the pair rows in order, from c
// (accumulate) or +0; of dot_tile_pairs, four chains of 16 lanes added in a fixed tree
// (micro_kernels.hpp). The instruction rounds each of its two accumulations to nearest even and
// flushes denormal inputs and results to zero (Intel SDM, VDPBF16PS), so these results differ in
// the last bits from the F32 kernels on the widened values.
//
// Measured (docs/PERFORMANCE.md): on a Sapphire Rapids, 0.45-0.80x the AVX-512F set's widening
// kernels on BF16; on an AMD Zen 4, where vdpbf16ps does twice the multiply-adds of an F32 FMA
// in the same time, 1.2-1.9x (so isa.cpp prefers this set on AMD only). Tested under emulation
// (tests/kernels/emulated_kernels_test.cpp: SIMDe, with vdpbf16ps as the SDM's pseudo-code
// reads) and natively against the double-precision reference (on the Zen 4: passed).
//
// Only what this file defines goes into its object (see micro_kernels_avx512.cpp).
#include <cstdint>

#include "kernels/micro_kernels_x86.hpp"
#include "kernels/x86_intrinsics.hpp"

namespace grouplin::kernels::GROUPLIN_X86_NS {
namespace {

#define GROUPLIN_AVX512BF16 GROUPLIN_TARGET("avx512bf16,avx512f,avx2,fma")

#if defined(GROUPLIN_X86_EMULATED)
GROUPLIN_AVX512BF16 inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return emulated_dpbf16_ps(acc, a, b);
}
#else
GROUPLIN_AVX512BF16 inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
#endif

// The dword of A's pair row q of row a: depths 2q (low half) and 2q + 1; with `last_odd`, only
// depth 2q exists (the high half is +0 and nothing past it is read).
GROUPLIN_AVX512BF16 inline __m512i broadcast_pair(const uint16_t* a, int64_t q, bool last_odd) {
  uint32_t pair = a[2 * q];
  if (!last_odd) __builtin_memcpy(&pair, a + 2 * q, sizeof pair);
  return _mm512_set1_epi32(static_cast<int>(pair));
}

// MR rows x NS strips, one vdpbf16ps chain per element over the pair rows in order.
template <int MR, int NS>
GROUPLIN_AVX512BF16 void pair_fixed(int64_t kc, const uint16_t* a, int64_t lda, const uint32_t* b,
                                    int64_t b_strip, float* c, int64_t ldc, bool accumulate) {
  __m512 acc[MR][NS];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s)
      acc[i][s] = accumulate ? _mm512_loadu_ps(c + i * ldc + 16 * s) : _mm512_setzero_ps();
  }
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t q = 0; q < pairs; ++q) {
    const bool last_odd = 2 * q + 1 == kc;
    __m512i bv[NS];
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) bv[s] = _mm512_loadu_si512(b + s * b_strip + q * 16);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m512i av = broadcast_pair(a + i * lda, q, last_odd);
#pragma GCC unroll 4
      for (int s = 0; s < NS; ++s) acc[i][s] = dot_pairs(acc[i][s], av, bv[s]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) _mm512_storeu_ps(c + i * ldc + 16 * s, acc[i][s]);
  }
}

using PairFixed = void (*)(int64_t, const uint16_t*, int64_t, const uint32_t*, int64_t, float*,
                           int64_t, bool);

template <int NS>
constexpr PairFixed kByRows[kOuterRows] = {pair_fixed<1, NS>, pair_fixed<2, NS>, pair_fixed<3, NS>,
                                           pair_fixed<4, NS>, pair_fixed<5, NS>, pair_fixed<6, NS>};

void pair_tile_avx512bf16(int mr, int strips, int64_t kc, const uint16_t* a, int64_t lda,
                          const uint32_t* b, int64_t b_strip, float* c, int64_t ldc,
                          bool accumulate) {
  const PairFixed* by_rows = strips == 1   ? kByRows<1>
                             : strips == 2 ? kByRows<2>
                             : strips == 3 ? kByRows<3>
                                           : kByRows<4>;
  by_rows[mr - 1](kc, a, lda, b, b_strip, c, ldc, accumulate);
}

// One element of dot_tile_pairs from its 16 lane sums: lanes l and l + 8 added, then l and l + 4,
// l and l + 2, l and l + 1. GCC 12's avx512fintrin.h casts and extracts 256-bit halves from an
// undefined vector, which -Wuninitialized reports at every use: silenced here only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
GROUPLIN_AVX512BF16 inline float sum_pair_lanes(__m512 v) {
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

// One block of 32 depths (at a and w) of dot_pairs_fixed into its chain r: MR vdpbf16ps.
template <int MR>
GROUPLIN_AVX512BF16 inline void dot_pairs_block(const uint16_t* a, int64_t lda, const uint16_t* w,
                                                __m512 (*acc)[4], int r) {
  const __m512i wv = _mm512_loadu_si512(w);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i)
    acc[i][r] = dot_pairs(acc[i][r], _mm512_loadu_si512(a + i * lda), wv);
}

// MR rows of a against one row of w, both read along the depth, in the four chains of
// dot_tile_pairs (block g into chain g mod 4, so that four vdpbf16ps are in flight per row of
// a). The depths after the last whole block of 32 go through zero-padded copies (nothing past a
// row is read).
template <int MR>
GROUPLIN_AVX512BF16 void dot_pairs_fixed(int64_t kc, const uint16_t* a, int64_t lda,
                                         const uint16_t* w, float* c, int64_t ldc) {
  __m512 acc[MR][4];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) acc[i][r] = _mm512_setzero_ps();
  }
  const int64_t blocks = kc / 32;
  int64_t g = 0;
  for (; g + 4 <= blocks; g += 4) {
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
      dot_pairs_block<MR>(a + 32 * (g + r), lda, w + 32 * (g + r), acc, r);
  }
  // The last 0-3 whole blocks, then the ragged one, each into its chain g mod 4 (g mod 4 = 0 here).
#pragma GCC unroll 3
  for (int r = 0; r < 3; ++r) {
    if (g < blocks) {
      dot_pairs_block<MR>(a + 32 * g, lda, w + 32 * g, acc, r);
      ++g;
    }
  }
  if (32 * blocks < kc) {
    alignas(64) uint16_t at[MR][32] = {};
    alignas(64) uint16_t wt[32] = {};
    const size_t bytes = sizeof(uint16_t) * static_cast<size_t>(kc - 32 * blocks);
    for (int i = 0; i < MR; ++i) __builtin_memcpy(at[i], a + i * lda + 32 * blocks, bytes);
    __builtin_memcpy(wt, w + 32 * blocks, bytes);
    switch (blocks % 4) {
      case 0:
        dot_pairs_block<MR>(at[0], 32, wt, acc, 0);
        break;
      case 1:
        dot_pairs_block<MR>(at[0], 32, wt, acc, 1);
        break;
      case 2:
        dot_pairs_block<MR>(at[0], 32, wt, acc, 2);
        break;
      default:
        dot_pairs_block<MR>(at[0], 32, wt, acc, 3);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    const __m512 sum =
        _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]), _mm512_add_ps(acc[i][2], acc[i][3]));
    c[i * ldc] = sum_pair_lanes(sum);
  }
}

// One weight row after another: each row's depth is one stream in memory (on a Zen 4 VM, two
// or four rows read side by side drew half the bandwidth of one).
void dot_tile_pairs_avx512bf16(int mr, int nr, int64_t kc, const uint16_t* a, int64_t lda,
                               const uint16_t* w, int64_t ldw, float* c, int64_t ldc) {
  using Fixed = void (*)(int64_t, const uint16_t*, int64_t, const uint16_t*, float*, int64_t);
  constexpr Fixed kFixed[kPairDotRows] = {dot_pairs_fixed<1>, dot_pairs_fixed<2>,
                                          dot_pairs_fixed<3>, dot_pairs_fixed<4>,
                                          dot_pairs_fixed<5>, dot_pairs_fixed<6>};
  for (int j = 0; j < nr; ++j) kFixed[mr - 1](kc, a, lda, w + j * ldw, c + j, ldc);
}

}  // namespace

void add_avx512bf16(MicroKernels& set) {
  set.pair_tile = pair_tile_avx512bf16;
  set.dot_tile_pairs = dot_tile_pairs_avx512bf16;
  set.pair_rows = kOuterRows;
  set.pair_strips = kMaxStrips;
  set.name = "avx512bf16";
}

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
