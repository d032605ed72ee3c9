// The AVX512-BF16 kernel set (x86-64 builds; see micro_kernels_x86.hpp): the AVX-512F set plus
// pair_tile, BF16 x BF16 products by vdpbf16ps. Each instruction multiplies, per 32-bit lane, one
// pair of BF16 values of A (broadcast: two adjacent depths of one row of x or dy, read in place)
// by the pair of B (the same two depths of one column, from a pair panel) and adds both products
// to the lane's F32 sum: the operands stay BF16 (half the bytes of widened ones through the
// registers) and one instruction does two multiply-adds per lane. The register tile is the F32
// set's: 6 rows x 4 strips of 16 columns, 24 zmm sums. dot_tile_pairs, for forward of experts
// with 1-6 rows (1-8 at depths up to 2048: tile_paths.hpp), reads x's and the weights' rows along
// the depth, as they lie, one weight row at a time (one memory stream), and sums each element in
// four chains of 16 lanes: one load and one vdpbf16ps per 32 weights (docs/PERFORMANCE.md, "The
// kernels' constants": kPairDotMaxRows, kPairDotShallowMaxRows).
// pair_tile_half is pair_tile whose last strip sums only its first 8 columns by the 256-bit
// vdpbf16ps (AVX512VL), at half the cost: a last strip of 1-8 rows of x or columns, the same
// chains. pair_tile_scaled is pair_tile with each 128-deep block's sums scaled once (FP8 weights
// decoded into pair panels). fma_rows_pairs, for dgrad of experts with 3-64 rows, reads the weights
// along their rows and interleaves two of them into pairs in registers (AVX512BW word unpacks)
// instead of packing pair panels for so few rows of dy. The FP8 kernels proper are in
// micro_kernels_avx512bf16_fp8.cpp.
//
// Each element's sum of pair_tile and of fma_rows_pairs is one chain of vdpbf16ps over the pair
// rows in order, from c (accumulate) or +0; of dot_tile_pairs, four chains of 16 lanes added in a
// fixed tree (micro_kernels.hpp). The instruction rounds each of its two accumulations to nearest
// even and flushes denormal inputs and results to zero (Intel SDM, VDPBF16PS), so these results
// differ in the last bits from the F32 kernels on the widened values.
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
#include <iterator>

#include "kernels/micro_kernels_x86.hpp"
#include "kernels/rows_ahead.hpp"
#include "kernels/x86_intrinsics.hpp"

namespace grouplin::kernels::GROUPLIN_X86_NS {
namespace {

// One pair row of MR rows x NS strips into acc: NS loads of B (at b, strips b_strip apart), MR
// broadcasts of A (the dword at a + i * lda, or with `odd_last` its low half alone), MR x NS
// vdpbf16ps. kHalf (pair_tile_half): the last strip's first 8 columns only, summed in half[MR]
// by the 256-bit vdpbf16ps (acc's last strip unused). The low half of A's broadcast is a cast,
// which GCC 12 reports as uninitialized (as sum_pair_lanes says): silenced here only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
template <int MR, int NS, bool kHalf = false>
GROUPLIN_AVX512BF16 inline void pair_row(const uint16_t* a, int64_t lda, const uint32_t* b,
                                         int64_t b_strip, bool odd_last, __m512 (&acc)[MR][NS],
                                         __m256* half = nullptr) {
  constexpr int kWhole = kHalf ? NS - 1 : NS;
  __m512i bv[NS];
#pragma GCC unroll 4
  for (int s = 0; s < kWhole; ++s) bv[s] = _mm512_loadu_si512(b + s * b_strip);
  [[maybe_unused]] __m256i bh;
  if constexpr (kHalf) {
    bh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + kWhole * b_strip));
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    const __m512i av = broadcast_pair(a + i * lda, 0, odd_last);
#pragma GCC unroll 4
    for (int s = 0; s < kWhole; ++s) acc[i][s] = dot_pairs(acc[i][s], av, bv[s]);
    if constexpr (kHalf) half[i] = dot_pairs_half(half[i], _mm512_castsi512_si256(av), bh);
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Pair rows [q0, q1) of MR rows x NS strips into acc, in pair-row order (the chains' order): the
// whole pairs in a loop that tests nothing but its end (a test of the odd last depth in every
// pair row, and the registers it held, cost ~10% of the kernel's rate on data in L1), then the
// pair of depth kc - 1 alone when kc is odd and it is in the range.
template <int MR, int NS, bool kHalf = false>
GROUPLIN_AVX512BF16 inline void pair_rows(int64_t q0, int64_t q1, int64_t kc, const uint16_t* a,
                                          int64_t lda, const uint32_t* b, int64_t b_strip,
                                          __m512 (&acc)[MR][NS], __m256* half = nullptr) {
  const int64_t whole = std::min(q1, kc / 2);
  const uint16_t* ap = a + 2 * q0;
  const uint32_t* bp = b + q0 * 16;
  for (int64_t q = q0; q < whole; ++q, ap += 2, bp += 16) {
    pair_row<MR, NS, kHalf>(ap, lda, bp, b_strip, false, acc, half);
  }
  if (whole < q1) {
    pair_row<MR, NS, kHalf>(a + 2 * whole, lda, b + whole * 16, b_strip, true, acc, half);
  }
}

// MR rows x NS strips, one vdpbf16ps chain per element over the pair rows in order; kHalf: the
// last strip's first 8 columns only (pair_tile_half), the same chains.
template <int MR, int NS, bool kHalf = false>
GROUPLIN_AVX512BF16 void pair_fixed(int64_t kc, const uint16_t* a, int64_t lda, const uint32_t* b,
                                    int64_t b_strip, float* c, int64_t ldc, bool accumulate) {
  constexpr int kWhole = kHalf ? NS - 1 : NS;
  __m512 acc[MR][NS];
  __m256 half[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int s = 0; s < kWhole; ++s)
      acc[i][s] = accumulate ? _mm512_loadu_ps(c + i * ldc + 16 * s) : _mm512_setzero_ps();
    if constexpr (kHalf) {
      half[i] = accumulate ? _mm256_loadu_ps(c + i * ldc + 16 * kWhole) : _mm256_setzero_ps();
    }
  }
  pair_rows<MR, NS, kHalf>(0, (kc + 1) / 2, kc, a, lda, b, b_strip, acc, half);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int s = 0; s < kWhole; ++s) _mm512_storeu_ps(c + i * ldc + 16 * s, acc[i][s]);
    if constexpr (kHalf) _mm256_storeu_ps(c + i * ldc + 16 * kWhole, half[i]);
  }
}

using PairFixed = void (*)(int64_t, const uint16_t*, int64_t, const uint32_t*, int64_t, float*,
                           int64_t, bool);

template <int NS, bool kHalf = false>
constexpr PairFixed kByRows[kOuterRows] = {pair_fixed<1, NS, kHalf>, pair_fixed<2, NS, kHalf>,
                                           pair_fixed<3, NS, kHalf>, pair_fixed<4, NS, kHalf>,
                                           pair_fixed<5, NS, kHalf>, pair_fixed<6, NS, kHalf>};

// pair_tile (kHalf false) and pair_tile_half (true): the fixed kernel of the call's shape.
template <bool kHalf>
void pair_tile_avx512bf16(int mr, int strips, int64_t kc, const uint16_t* a, int64_t lda,
                          const uint32_t* b, int64_t b_strip, float* c, int64_t ldc,
                          bool accumulate) {
  constexpr const PairFixed* kByStrips[] = {kByRows<1, kHalf>, kByRows<2, kHalf>, kByRows<3, kHalf>,
                                            kByRows<4, kHalf>};
  static_assert(std::size(kByStrips) == kMaxStrips);
  kByStrips[strips - 1][mr - 1](kc, a, lda, b, b_strip, c, ldc, accumulate);
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
  constexpr const PairScaledFixed* kByStrips[] = {kScaledByRows<1>, kScaledByRows<2>,
                                                  kScaledByRows<3>, kScaledByRows<4>};
  static_assert(std::size(kByStrips) == kMaxStrips);
  kByStrips[strips - 1][mr - 1](kc, a, lda, b, b_strip, scales, scale_q, per_row, c, ldc,
                                accumulate);
}

// Which blocks of 32 depths step the walk of the rows ahead: every block (one register tile per
// weight row; from kDotAheadMinRows rows), or, where two register tiles take each weight row in
// turn, the even blocks in the first and the odd ones in the second (any row count), so that the
// prefetches spread over both tiles' time at the rate the row is read.
enum class AheadSteps { kEvery, kEven, kOdd };
template <int MR, AheadSteps kSteps>
inline void step_ahead(RowsAhead& ahead, int64_t block) {
  if constexpr (kSteps == AheadSteps::kEvery) {
    if constexpr (MR >= kDotAheadMinRows) ahead.step();
  } else if (block % 2 == (kSteps == AheadSteps::kOdd ? 1 : 0)) {
    ahead.step();
  }
}

// MR rows of a against one row of w, both read along the depth, in the four chains of
// dot_tile_pairs (block g into chain g mod 4, so that four vdpbf16ps are in flight per row of
// a); a line of the rows ahead is prefetched per block (kSteps). The depths after the last whole
// block of 32 go through zero-padded copies (nothing past a row is read).
template <int MR, AheadSteps kSteps = AheadSteps::kEvery>
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
      step_ahead<MR, kSteps>(ahead, g + r);
      dot_pairs_block<MR>(a + 32 * (g + r), lda, w + 32 * (g + r), acc, r);
    }
  }
  // The last 0-3 whole blocks, then the ragged one, each into its chain g mod 4 (g mod 4 = 0 here).
#pragma GCC unroll 3
  for (int r = 0; r < 3; ++r) {
    if (g < blocks) {
      step_ahead<MR, kSteps>(ahead, g);
      dot_pairs_block<MR>(a + 32 * g, lda, w + 32 * g, acc, r);
      ++g;
    }
  }
  if (32 * blocks < kc) {
    step_ahead<MR, kSteps>(ahead, blocks);
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
  if (mr <= kPairDotRows) {
    for (int j = 0; j < nr; ++j) kFixed[mr - 1](kc, a, lda, w + j * ldw, c + j, ldc, ahead);
    return;
  }
  // More rows than a register tile holds: two tiles take each weight row in turn, the second
  // reading it from L1 (faster than one tile over every row and then the other, from L2:
  // docs/PERFORMANCE.md, "BF16 forward of 7-8 rows: each weight row through both register
  // tiles in turn"), each stepping the walk on every other block (faster than the first tile
  // stepping on every block: "BF16 forward of 7-8 rows: the prefetches spread over both tiles").
  // mr is 7 or 8 here: a tile of 4 rows, then one of the other 3 or 4.
  static_assert(kPairDotRows == 6 && kPairDotCallRows == 8);
  const Fixed second =
      mr == 8 ? dot_pairs_fixed<4, AheadSteps::kOdd> : dot_pairs_fixed<3, AheadSteps::kOdd>;
  for (int j = 0; j < nr; ++j) {
    dot_pairs_fixed<4, AheadSteps::kEven>(kc, a, lda, w + j * ldw, c + j, ldc, ahead);
    second(kc, a + 4 * lda, lda, w + j * ldw, c + 4 * ldc + j, ldc, ahead);
  }
}

// dgrad of a few rows on BF16 weights (fma_rows_pairs). vdpbf16ps takes its pairs along the
// depth, which on the weights runs down their columns (depths p and p + 1 of a column lie in two
// rows): two rows' 32 columns are interleaved word by word, within 128-bit lanes, so that `low`
// holds in lane k the pairs of columns 8k + 0..3 and `high` those of 8k + 4..7 (faster than
// merging them by 32-bit shifts and blends: docs/PERFORMANCE.md).
GROUPLIN_AVX512BF16 inline void interleave_row_pairs(__m512i p, __m512i q, __m512i& low,
                                                     __m512i& high) {
  low = _mm512_unpacklo_epi16(p, q);
  high = _mm512_unpackhi_epi16(p, q);
}

// Sums of 32 columns between c's order (`first`: columns 0-15, `second`: 16-31) and the order of
// interleave_row_pairs.
GROUPLIN_AVX512BF16 inline void split_columns(__m512 first, __m512 second, __m512& low,
                                              __m512& high) {
  low = _mm512_permutex2var_ps(
      first, _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27), second);
  high = _mm512_permutex2var_ps(
      first, _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31), second);
}
GROUPLIN_AVX512BF16 inline void join_columns(__m512 low, __m512 high, __m512& first,
                                             __m512& second) {
  first = _mm512_permutex2var_ps(
      low, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23), high);
  second = _mm512_permutex2var_ps(
      low, _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31), high);
}

// The first n of a row's 32 BF16 weights at `row` (none when n <= 0), zeros after, nothing past
// them read.
template <bool kPartial>
GROUPLIN_AVX512BF16 inline __m512i load_row_words(const uint16_t* row, int64_t n) {
  return kPartial ? load_first_bytes(row, 2 * n) : _mm512_loadu_si512(row);
}

// fma_rows_pairs goes by blocks of kPairRowsBlock depths: a block's weights (its rows x the call's
// columns) are read down their columns, 32 at a time, by groups of at most kPairRowsGroup rows of
// dy whose sums stay in registers (16 of them: taller groups spill), while the next block is
// prefetched along its rows (one stream; docs/PERFORMANCE.md, "BF16 dgrad of a few rows by pair
// rows").
constexpr int64_t kPairRowsBlock = 128;
constexpr int kPairRowsGroup = 8;

// Where a group's weight pairs come from: the weight rows, interleaved (kRows); the same, the pairs
// also kept for the block's later groups (kRowsKept); the pairs kept by the first group (kKept).
enum class PairSource { kRows, kRowsKept, kKept };

// One pair of depths (p, and p + 1 unless kOdd: then p alone, the high halves +0) of MR rows of a
// against 32 columns of w (kPartial: the first n, zeros after) into acc; `kept`: this pair's 32
// dwords of kept pairs.
template <int MR, bool kPartial, bool kOdd, PairSource kFrom>
GROUPLIN_AVX512BF16 inline void pair_rows_step(int64_t p, const uint16_t* a, int64_t lda,
                                               const uint16_t* w, int64_t ldw, int64_t n,
                                               uint32_t* kept, __m512 (&acc)[MR][2],
                                               RowsAhead& ahead) {
  __m512i low, high;
  if constexpr (kFrom == PairSource::kKept) {
    low = _mm512_load_si512(kept);
    high = _mm512_load_si512(kept + 16);
  } else {
    const __m512i rp = load_row_words<kPartial>(w + p * ldw, n);
    const __m512i rq =
        kOdd ? _mm512_setzero_si512() : load_row_words<kPartial>(w + (p + 1) * ldw, n);
    interleave_row_pairs(rp, rq, low, high);
    if constexpr (kFrom == PairSource::kRowsKept) {
      _mm512_store_si512(kept, low);
      _mm512_store_si512(kept + 16, high);
    }
    ahead.step();
    ahead.step();
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m512i av = broadcast_pair(a + i * lda, p / 2, kOdd);
    acc[i][0] = dot_pairs(acc[i][0], av, low);
    acc[i][1] = dot_pairs(acc[i][1], av, high);
  }
}

// Depths p0..p1 (one block) of MR rows x 32 columns at w and c (kPartial: the first n): the
// chains go on from c (from +0 in the first block), in registers down the block, and back.
template <int MR, bool kPartial, PairSource kFrom>
GROUPLIN_AVX512BF16 void pair_rows_group(int64_t p0, int64_t p1, int64_t depth, const uint16_t* a,
                                         int64_t lda, const uint16_t* w, int64_t ldw, int64_t n,
                                         uint32_t* kept, float* c, int64_t ldc, RowsAhead& ahead) {
  const size_t bytes =
      sizeof(float) * static_cast<size_t>(kPartial ? std::min<int64_t>(n, 32) : 32);
  __m512 acc[MR][2];
  alignas(64) float buf[32];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if (p0 == 0) {
      acc[i][0] = acc[i][1] = _mm512_setzero_ps();
      continue;
    }
    const float* ci = c + i * ldc;
    if (kPartial) __builtin_memcpy(buf, ci, bytes);
    const float* from = kPartial ? buf : ci;
    split_columns(_mm512_loadu_ps(from), _mm512_loadu_ps(from + 16), acc[i][0], acc[i][1]);
  }
  const int64_t whole = std::min(p1, depth - depth % 2);
  for (int64_t p = p0; p < whole; p += 2, kept += 32)
    pair_rows_step<MR, kPartial, false, kFrom>(p, a, lda, w, ldw, n, kept, acc, ahead);
  if (whole < p1)
    pair_rows_step<MR, kPartial, true, kFrom>(whole, a, lda, w, ldw, n, kept, acc, ahead);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    __m512 first, second;
    join_columns(acc[i][0], acc[i][1], first, second);
    float* to = kPartial ? buf : c + i * ldc;
    _mm512_storeu_ps(to, first);
    _mm512_storeu_ps(to + 16, second);
    if (kPartial) __builtin_memcpy(c + i * ldc, buf, bytes);
  }
}

// pair_rows_group by rows, whole or partial, for each source of pairs.
using Group = void (*)(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*,
                       int64_t, int64_t, uint32_t*, float*, int64_t, RowsAhead&);
template <bool kPartial, PairSource kFrom>
constexpr Group kGroups[kPairRowsGroup] = {
    pair_rows_group<1, kPartial, kFrom>, pair_rows_group<2, kPartial, kFrom>,
    pair_rows_group<3, kPartial, kFrom>, pair_rows_group<4, kPartial, kFrom>,
    pair_rows_group<5, kPartial, kFrom>, pair_rows_group<6, kPartial, kFrom>,
    pair_rows_group<7, kPartial, kFrom>, pair_rows_group<8, kPartial, kFrom>};
template <bool kPartial>
constexpr const Group* kBySource[3] = {kGroups<kPartial, PairSource::kRows>,
                                       kGroups<kPartial, PairSource::kRowsKept>,
                                       kGroups<kPartial, PairSource::kKept>};

// Blocks of depths, in each the columns 32 at a time, in each the rows in groups of nearly equal
// heights (a last group of 1-2 rows would cost nearly as much as a full one); with more than one
// group, the first keeps the block's interleaved pairs of those columns (8 KiB) for the others,
// which would otherwise read the weights again (rows 4 or 8 KiB apart share an L1 set, so they
// come from L2) and interleave them again.
void fma_rows_pairs_avx512bf16(int rows, int64_t depth, const uint16_t* a, int64_t lda,
                               const uint16_t* w, int64_t ldw, int64_t cols, float* c, int64_t ldc,
                               const uint16_t* next) {
  const int groups = (rows + kPairRowsGroup - 1) / kPairRowsGroup;
  const int base = rows / groups, taller = rows % groups;  // the first `taller` get base + 1 rows
  alignas(64) uint32_t kept[kPairRowsBlock / 2 * 32];
  RowsAhead none = RowsAhead::none();
  for (int64_t p0 = 0; p0 < depth; p0 += kPairRowsBlock) {
    const int64_t p1 = std::min(depth, p0 + kPairRowsBlock);
    const int64_t rows_ahead = std::min(kPairRowsBlock, p1 < depth ? depth - p1 : depth);
    const uint16_t* first_ahead = p1 < depth ? w + p1 * ldw : next;
    RowsAhead ahead(first_ahead, 2 * ldw, 2 * cols, first_ahead != nullptr ? rows_ahead : 0, 0);
    for (int64_t j = 0; j < cols; j += 32) {
      const bool whole = j + 32 <= cols;
      for (int g = 0, i = 0; g < groups; ++g) {
        const int h = base + (g < taller ? 1 : 0);
        const PairSource from = groups == 1 ? PairSource::kRows
                                : g == 0    ? PairSource::kRowsKept
                                            : PairSource::kKept;
        const Group* by_rows = (whole ? kBySource<false> : kBySource<true>)[static_cast<int>(from)];
        by_rows[h - 1](p0, p1, depth, a + i * lda, lda, w + j, ldw, cols - j, kept, c + i * ldc + j,
                       ldc, g == 0 ? ahead : none);
        i += h;
      }
    }
  }
}

}  // namespace

void add_avx512bf16(MicroKernels& set) {
  set.fma_rows_pairs = fma_rows_pairs_avx512bf16;
  set.pair_tile = pair_tile_avx512bf16<false>;
  set.pair_tile_half = pair_tile_avx512bf16<true>;
  set.pair_tile_scaled = pair_tile_scaled_avx512bf16;
  set.dot_tile_pairs = dot_tile_pairs_avx512bf16;
  set.pair_rows = kOuterRows;
  set.pair_strips = kMaxStrips;
  set.name = "avx512bf16";
}

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
