// The AVX512-BF16 kernel set (x86-64 builds; see micro_kernels_x86.hpp): the AVX-512F set plus
// pair_tile, BF16 x BF16 products by vdpbf16ps. Each instruction multiplies, per 32-bit lane, one
// pair of BF16 values of A (broadcast: two adjacent depths of one row of x or dy, read in place)
// by the pair of B (the same two depths of one column, from a pair panel) and adds both products
// to the lane's F32 sum: the operands stay BF16 (half the bytes of widened ones through the
// registers) and one instruction does two multiply-adds per lane. The register tile is the F32
// set's: 6 rows x 4 strips of 16 columns, 24 zmm sums. dot_tile_pairs, for forward of experts
// with 1-6 rows, reads x's and the weights' rows along the depth, as they lie, one weight row at
// a time (one memory stream), and sums each element in four chains of 16 lanes: one load and one
// vdpbf16ps per 32 weights (docs/PERFORMANCE.md, "The kernels' constants": kPairDotMaxRows).
// pair_tile_scaled is pair_tile with each 128-deep block's sums scaled once (FP8 weights decoded
// into pair panels). The FP8 kernels proper are in micro_kernels_avx512bf16_fp8.cpp.
//
// Each element's sum of pair_tile is one chain of vdpbf16ps over the pair rows in order, from c
// (accumulate) or +0; of dot_tile_pairs, four chains of 16 lanes added in a fixed tree
// (micro_kernels.hpp). The instruction rounds each of its two accumulations to nearest even and
// flushes denormal inputs and results to zero (Intel SDM, VDPBF16PS), so these results differ in
// the last bits from the F32 kernels on the widened values.
//
// Slower than the AVX-512F set's widening kernels on BF16 on a Sapphire Rapids, faster on an AMD
// Zen 4, where vdpbf16ps does twice the multiply-adds of an F32 FMA in the same time (so isa.cpp
// prefers this set on AMD only; docs/PERFORMANCE.md). Tested under emulation
// (tests/kernels/emulated_kernels_test.cpp: SIMDe, with vdpbf16ps as the SDM's pseudo-code
// reads) and natively against the double-precision reference (on the Zen 4: passed).
//
// Only what this file defines goes into its object (see micro_kernels_avx512.cpp).
#include "kernels/micro_kernels_avx512bf16.hpp"

#include <algorithm>
#include <cstdint>

#include "kernels/micro_kernels_x86.hpp"
#include "kernels/rows_ahead.hpp"
#include "kernels/x86_intrinsics.hpp"

namespace grouplin::kernels::GROUPLIN_X86_NS {
namespace {

// One pair row of MR rows x NS strips into acc: NS loads of B (at b, strips b_strip apart), MR
// broadcasts of A (the dword at a + i * lda, or with `odd_last` its low half alone), MR x NS
// vdpbf16ps.
template <int MR, int NS>
GROUPLIN_AVX512BF16 inline void pair_row(const uint16_t* a, int64_t lda, const uint32_t* b,
                                         int64_t b_strip, bool odd_last, __m512 (&acc)[MR][NS]) {
  __m512i bv[NS];
#pragma GCC unroll 4
  for (int s = 0; s < NS; ++s) bv[s] = _mm512_loadu_si512(b + s * b_strip);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    const __m512i av = broadcast_pair(a + i * lda, 0, odd_last);
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) acc[i][s] = dot_pairs(acc[i][s], av, bv[s]);
  }
}

// Pair rows [q0, q1) of MR rows x NS strips into acc, in pair-row order (the chains' order): the
// whole pairs in a loop that tests nothing but its end (a test of the odd last depth in every
// pair row, and the registers it held, cost ~10% of the kernel's rate on data in L1), then the
// pair of depth kc - 1 alone when kc is odd and it is in the range.
template <int MR, int NS>
GROUPLIN_AVX512BF16 inline void pair_rows(int64_t q0, int64_t q1, int64_t kc, const uint16_t* a,
                                          int64_t lda, const uint32_t* b, int64_t b_strip,
                                          __m512 (&acc)[MR][NS]) {
  const int64_t whole = std::min(q1, kc / 2);
  const uint16_t* ap = a + 2 * q0;
  const uint32_t* bp = b + q0 * 16;
  for (int64_t q = q0; q < whole; ++q, ap += 2, bp += 16) {
    pair_row<MR, NS>(ap, lda, bp, b_strip, false, acc);
  }
  if (whole < q1) pair_row<MR, NS>(a + 2 * whole, lda, b + whole * 16, b_strip, true, acc);
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
  pair_rows<MR, NS>(0, (kc + 1) / 2, kc, a, lda, b, b_strip, acc);
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

// One block of 32 depths (at a and w) of dot_pairs_fixed into its chain r: MR vdpbf16ps.
template <int MR>
GROUPLIN_AVX512BF16 inline void dot_pairs_block(const uint16_t* a, int64_t lda, const uint16_t* w,
                                                __m512 (*acc)[4], int r) {
  const __m512i wv = _mm512_loadu_si512(w);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i)
    acc[i][r] = dot_pairs(acc[i][r], _mm512_loadu_si512(a + i * lda), wv);
}

// pair_tile_scaled: per block of kFp8Block depths, MR x NS chains from +0 in registers (the
// 24 sums of the 6 x 4 tile, as pair_fixed), then each folded into c by one fused multiply-add
// by its block's scale (c in L1: a load and a store per 64 vdpbf16ps of each element).
template <int MR, int NS>
GROUPLIN_AVX512BF16 void pair_scaled_fixed(int64_t kc, const uint16_t* a, int64_t lda,
                                           const uint32_t* b, int64_t b_strip, const float* scales,
                                           int64_t scale_q, bool per_row, float* c, int64_t ldc,
                                           bool accumulate) {
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t q0 = 0, block = 0; q0 < pairs; q0 += kFp8Block / 2, ++block) {
    __m512 t[MR][NS];
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int s = 0; s < NS; ++s) t[i][s] = _mm512_setzero_ps();
    }
    pair_rows<MR, NS>(q0, std::min(pairs, q0 + kFp8Block / 2), kc, a, lda, b, b_strip, t);
    const float* sq = scales + block * scale_q;
    const bool fresh = !accumulate && block == 0;
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int s = 0; s < NS; ++s) {
        float* ci = c + i * ldc + 16 * s;
        const __m512 scale = per_row ? _mm512_set1_ps(sq[i]) : _mm512_loadu_ps(sq + 16 * s);
        const __m512 old = fresh ? _mm512_setzero_ps() : _mm512_loadu_ps(ci);
        _mm512_storeu_ps(ci, _mm512_fmadd_ps(t[i][s], scale, old));
      }
    }
  }
}

using PairScaledFixed = void (*)(int64_t, const uint16_t*, int64_t, const uint32_t*, int64_t,
                                 const float*, int64_t, bool, float*, int64_t, bool);

template <int NS>
constexpr PairScaledFixed kScaledByRows[kOuterRows] = {
    pair_scaled_fixed<1, NS>, pair_scaled_fixed<2, NS>, pair_scaled_fixed<3, NS>,
    pair_scaled_fixed<4, NS>, pair_scaled_fixed<5, NS>, pair_scaled_fixed<6, NS>};

void pair_tile_scaled_avx512bf16(int mr, int strips, int64_t kc, const uint16_t* a, int64_t lda,
                                 const uint32_t* b, int64_t b_strip, const float* scales,
                                 int64_t scale_q, bool per_row, float* c, int64_t ldc,
                                 bool accumulate) {
  const PairScaledFixed* by_rows = strips == 1   ? kScaledByRows<1>
                                   : strips == 2 ? kScaledByRows<2>
                                   : strips == 3 ? kScaledByRows<3>
                                                 : kScaledByRows<4>;
  by_rows[mr - 1](kc, a, lda, b, b_strip, scales, scale_q, per_row, c, ldc, accumulate);
}

// MR rows of a against one row of w, both read along the depth, in the four chains of
// dot_tile_pairs (block g into chain g mod 4, so that four vdpbf16ps are in flight per row of
// a); a line of the rows ahead is prefetched per block. The depths after the last whole block of
// 32 go through zero-padded copies (nothing past a row is read).
template <int MR>
GROUPLIN_AVX512BF16 void dot_pairs_fixed(int64_t kc, const uint16_t* a, int64_t lda,
                                         const uint16_t* w, float* c, int64_t ldc,
                                         RowsAhead& ahead) {
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
    for (int r = 0; r < 4; ++r) {
      if constexpr (MR >= kDotAheadMinRows) ahead.step();
      dot_pairs_block<MR>(a + 32 * (g + r), lda, w + 32 * (g + r), acc, r);
    }
  }
  // The last 0-3 whole blocks, then the ragged one, each into its chain g mod 4 (g mod 4 = 0 here).
#pragma GCC unroll 3
  for (int r = 0; r < 3; ++r) {
    if (g < blocks) {
      if constexpr (MR >= kDotAheadMinRows) ahead.step();
      dot_pairs_block<MR>(a + 32 * g, lda, w + 32 * g, acc, r);
      ++g;
    }
  }
  if (32 * blocks < kc) {
    if constexpr (MR >= kDotAheadMinRows) ahead.step();
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
// or four rows read side by side drew half the bandwidth of one), the rows ahead prefetched
// (rows_ahead.hpp).
void dot_tile_pairs_avx512bf16(int mr, int nr, int64_t kc, const uint16_t* a, int64_t lda,
                               const uint16_t* w, int64_t ldw, float* c, int64_t ldc) {
  using Fixed =
      void (*)(int64_t, const uint16_t*, int64_t, const uint16_t*, float*, int64_t, RowsAhead&);
  constexpr Fixed kFixed[kPairDotRows] = {dot_pairs_fixed<1>, dot_pairs_fixed<2>,
                                          dot_pairs_fixed<3>, dot_pairs_fixed<4>,
                                          dot_pairs_fixed<5>, dot_pairs_fixed<6>};
  RowsAhead ahead(w, 2 * ldw, 2 * kc, nr, kDotAheadBytes);
  for (int j = 0; j < nr; ++j) kFixed[mr - 1](kc, a, lda, w + j * ldw, c + j, ldc, ahead);
}

}  // namespace

void add_avx512bf16(MicroKernels& set) {
  set.pair_tile = pair_tile_avx512bf16;
  set.pair_tile_scaled = pair_tile_scaled_avx512bf16;
  set.dot_tile_pairs = dot_tile_pairs_avx512bf16;
  set.pair_rows = kOuterRows;
  set.pair_strips = kMaxStrips;
  set.name = "avx512bf16";
}

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
