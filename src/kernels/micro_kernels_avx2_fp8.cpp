// The AVX2+FMA set's FP8 kernels (see micro_kernels_avx2.hpp): E4M3 weights decoded in registers
// for the forward dot tiles and the few-row dgrad, and decoded into F32 rows for the other paths.
// Every value is code x scale rounded once, as f8e4m3_to_f32 and one F32 multiply give it.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/micro_kernels.hpp"
#include "kernels/micro_kernels_avx2.hpp"

namespace grouplin::kernels::native {
namespace {

// E4M3 codes moved onto F32's bits: sign-extended and shifted left by 20, a code's exponent and
// fraction bits land on F32's (its sign on bit 31 and, cleared by the mask, bits 27-30), so that
// the lanes read 2^(e - 127) (1 + f/8), or for e = 0 the subnormal f * 2^-129: the code's value
// times 2^-120, sign included (a NaN code reads 480 x 2^-120).
GROUPLIN_AVX2 inline __m256 e4m3_bits(const uint8_t* src) {
  const __m256i codes =
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(codes, 20),
                                              _mm256_set1_epi32(static_cast<int>(0x87f00000u))));
}

// The scale with E4M3's 2^120 folded in, when that changes no product: x 2^120 is exact while
// finite, and one multiply by it rounds code x scale once, as two would (an infinite or NaN scale
// stays what it was). NaN where a block needs decode8_e4m3's two multiplies.
inline float folded_scale(float scale) {
  const float folded = scale * 0x1p120f;
  return std::isfinite(folded) || !std::isfinite(scale) ? folded : std::nanf("");
}
inline bool foldable(float folded) { return !std::isnan(folded); }

// 8 codes, none a NaN code, to their values times the scale: one multiply by the folded scale,
// a third of decode8_e4m3's operations (docs/PERFORMANCE.md, "Measurements behind the code's
// comments").
GROUPLIN_AVX2 inline __m256 decode8_e4m3_finite(const uint8_t* src, __m256 folded) {
  return _mm256_mul_ps(e4m3_bits(src), folded);
}

// 8 codes to their values times the scale, NaN codes giving f8e4m3_to_f32's NaN with their sign:
// the exact value (x 2^120), then the scale's one rounding multiply.
GROUPLIN_AVX2 inline __m256 decode8_e4m3(const uint8_t* src, __m256 scale) {
  const __m256i codes =
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
  const __m256i nan =
      _mm256_cmpeq_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(0x7f)), _mm256_set1_epi32(0x7f));
  const __m256 quiet = _mm256_castsi256_ps(
      _mm256_or_si256(_mm256_set1_epi32(0x7fc00000),
                      _mm256_and_si256(_mm256_slli_epi32(codes, 24),
                                       _mm256_set1_epi32(static_cast<int>(0x80000000u)))));
  const __m256 exact = _mm256_mul_ps(e4m3_bits(src), _mm256_set1_ps(0x1p120f));
  return _mm256_mul_ps(_mm256_blendv_ps(exact, quiet, _mm256_castsi256_ps(nan)), scale);
}

// Whether any of the 32 codes from column k on of the NR rows is a NaN code: checked once per 32
// codes (one test for all rows), so that the common case takes decode8_e4m3_finite.
template <int NR>
GROUPLIN_AVX2 inline bool any_nan32_rows(const uint8_t* const* rows, int64_t k) {
  __m256i hits = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j] + k));
    hits = _mm256_or_si256(hits, _mm256_cmpeq_epi8(_mm256_and_si256(v, _mm256_set1_epi8(0x7f)),
                                                   _mm256_set1_epi8(0x7f)));
  }
  return !_mm256_testz_si256(hits, hits);
}

// The first n (< 8) decoded values from codes on, zero beyond (as load_b_tail).
GROUPLIN_AVX2 inline __m256 decode_tail_e4m3(const uint8_t* codes, int64_t n, __m256 scale) {
  alignas(8) uint8_t padded[8] = {};
  for (int64_t i = 0; i < n; ++i) padded[i] = codes[i];
  return _mm256_and_ps(decode8_e4m3(padded, scale), _mm256_castsi256_ps(first_lanes(n)));
}

// One 8-value step of dot_tile_fp8_avx2_fixed at column k of B's rows: decoded (kFinite: no NaN
// code among them, `scale` folded; otherwise the plain scale), then the fused multiply-adds.
template <int MR, int NR, bool kFinite>
GROUPLIN_AVX2 inline void dot_fp8_step(const float* a, int64_t lda, const uint8_t* const* rows,
                                       int64_t k, const float* scale, __m256 (*acc)[NR]) {
  if constexpr (MR * NR >= 9) {
    // 9-12 sums: one weight row decoded at a time, each fused multiply-add reading its x value
    // from memory (L1) and each row its scale. Held in registers beside 12 sums (the x values,
    // the decoded rows, the scales and the mask) they did not fit: GCC spilled sums, 45 stack
    // references in the 4 x 3 loop (9 now). The empty asm statements keep it from hoisting the
    // loads back out of the loop. Faster at 9-12 sums, slower for fewer (docs/PERFORMANCE.md).
    const float* sc = scale;
    asm("" : "+r"(sc));
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      const __m256 bv = kFinite ? decode8_e4m3_finite(rows[j] + k, _mm256_set1_ps(sc[j]))
                                : decode8_e4m3(rows[j] + k, _mm256_set1_ps(sc[j]));
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i * lda + k), bv, acc[i][j]);
      }
      asm volatile("" ::: "memory");
    }
    return;
  }
  __m256 bv[NR];
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) {
    bv[j] = kFinite ? decode8_e4m3_finite(rows[j] + k, _mm256_set1_ps(scale[j]))
                    : decode8_e4m3(rows[j] + k, _mm256_set1_ps(scale[j]));
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    const __m256 av = _mm256_loadu_ps(a + i * lda + k);
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(av, bv[j], acc[i][j]);
  }
}

// dot_tile_avx2_fixed with B decoded from FP8 in registers: the same chain of fused
// multiply-adds on the decoded values. Each 8-value step lies in one scale block (col0 and the
// steps are multiples of 8); NaN codes are looked for once per 32 values. The scales are
// broadcast from memory in each step, which keeps the 16 ymm registers for the accumulators and
// the decoded values (kept in registers, they spilled the 1 x 3 tile's accumulators).
template <int MR, int NR>
GROUPLIN_AVX2 void dot_tile_fp8_avx2_fixed(int64_t kc, const float* a, int64_t lda,
                                           const Fp8Operand& b, float* c, int64_t ldc) {
  const float* scale_row[NR];
  const uint8_t* rows[NR];
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) {
    scale_row[j] = b.scales + ((b.row0 + j) / kFp8Block) * b.scale_ld;
    rows[j] = b.codes + j * b.ld;
  }
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (int64_t block_end = 0; k + 8 <= kc; k = block_end) {
    // One scale block (or what of it the tile spans) at a time.
    const int64_t block = (b.col0 + k) / kFp8Block;
    block_end = std::min((block + 1) * kFp8Block - b.col0, kc / 8 * 8);
    float scale[NR], folded[NR];
    bool fold = true;
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      scale[j] = scale_row[j][block];
      folded[j] = folded_scale(scale[j]);
      fold = fold && foldable(folded[j]);
    }
    int64_t kk = k;
    for (; kk + 32 <= block_end; kk += 32) {
      if (b.ahead != nullptr && kk % 64 == 0) {
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) {
          _mm_prefetch(reinterpret_cast<const char*>(b.ahead + j * b.ld + kk), _MM_HINT_T0);
        }
      }
      if (fold && !any_nan32_rows<NR>(rows, kk)) {
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q)
          dot_fp8_step<MR, NR, true>(a, lda, rows, kk + 8 * q, folded, acc);
      } else {
        for (int q = 0; q < 4; ++q)
          dot_fp8_step<MR, NR, false>(a, lda, rows, kk + 8 * q, scale, acc);
      }
    }
    for (; kk < block_end; kk += 8) dot_fp8_step<MR, NR, false>(a, lda, rows, kk, scale, acc);
  }
  if (k < kc) {
    const __m256i mask = first_lanes(kc - k);
    const int64_t block = (b.col0 + k) / kFp8Block;
    __m256 bv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      bv[j] = decode_tail_e4m3(rows[j] + k, kc - k, _mm256_set1_ps(scale_row[j][block]));
    }
    dot_tail_and_sums<MR, NR>(a, lda, k, mask, bv, acc, c, ldc);
  } else {
    dot_tail_and_sums<MR, NR>(a, lda, k, first_lanes(0), nullptr, acc, c, ldc);
  }
}

using DotFp8Fixed = void (*)(int64_t, const float*, int64_t, const Fp8Operand&, float*, int64_t);
template <int MR>
constexpr DotFp8Fixed kDotFp8Row[kDotCols] = {
    dot_tile_fp8_avx2_fixed<MR, 1>, dot_tile_fp8_avx2_fixed<MR, 2>, dot_tile_fp8_avx2_fixed<MR, 3>};
constexpr const DotFp8Fixed* kDotFp8Table[kDotRows] = {kDotFp8Row<1>, kDotFp8Row<2>, kDotFp8Row<3>,
                                                       kDotFp8Row<4>};

// c[r][j..j+8) += a(r, p) * b[p][j..j+8) for every row r < kRows (0: `rows` of them): one
// 8-column group of fma_rows_fp8, its B values decoded once.
template <int kRows>
GROUPLIN_AVX2 inline void fma_group_fp8(int64_t rows, const float* a, int64_t lda, int64_t p,
                                        __m256 bv, float* c, int64_t ldc, int64_t j) {
  const int64_t n = kRows > 0 ? kRows : rows;
#pragma GCC unroll 4
  for (int64_t r = 0; r < n; ++r) {
    float* cv = c + r * ldc + j;
    _mm256_storeu_ps(cv, _mm256_fmadd_ps(_mm256_set1_ps(a[r * lda + p]), bv, _mm256_loadu_ps(cv)));
  }
}

// c[r][0..n) += a(r, p) * b[p][0..n) for r < rows, n < 8: the ragged end of a row of b (as
// fma_row_avx2's: masked loads and stores, so every element gets one fused multiply-add).
GROUPLIN_AVX2 inline void fma_tail_fp8(int64_t rows, const float* a, int64_t lda, int64_t p,
                                       const uint8_t* codes, int64_t n, float scale, float* c,
                                       int64_t ldc) {
  const __m256i mask = first_lanes(n);
  const __m256 bv = decode_tail_e4m3(codes, n, _mm256_set1_ps(scale));
  for (int64_t r = 0; r < rows; ++r) {
    float* cv = c + r * ldc;
    const __m256 sum =
        _mm256_fmadd_ps(_mm256_set1_ps(a[r * lda + p]), bv, _mm256_maskload_ps(cv, mask));
    _mm256_maskstore_ps(cv, mask, sum);
  }
}

// fma_rows_avx2's dgrad order (a row of b read once for all rows of c, c in memory) with b
// decoded from FP8 in registers, 8 columns at a time, each group lying in one scale block; NaN
// codes looked for once per 32 columns. The ragged end as fma_row_avx2's (masked loads and
// stores). kRows > 0: that many rows, unrolled. Taken for one row, whose row of c stays in L1
// while the codes stream in order, and for more than 4.
template <int kRows>
GROUPLIN_AVX2 void fma_rows_fp8_by_row(int64_t rows, int64_t depth, const float* a, int64_t lda,
                                       const Fp8Operand& b, int64_t cols, float* c, int64_t ldc) {
  const int64_t full = cols / 8 * 8;
  for (int64_t p = 0; p < depth; ++p) {
    const float* scale_row = b.scales + ((b.row0 + p) / kFp8Block) * b.scale_ld;
    const uint8_t* codes = b.codes + p * b.ld;
    if (b.ahead != nullptr) {
      for (int64_t j = 0; j < cols; j += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(b.ahead + p * b.ld + j), _MM_HINT_T0);
      }
    }
    for (int64_t j = 0; j < full;) {
      const int64_t block = (b.col0 + j) / kFp8Block;
      const int64_t end = std::min(full, (block + 1) * kFp8Block - b.col0);
      const float scale = scale_row[block], f = folded_scale(scale);
      const __m256 sv = _mm256_set1_ps(scale), fv = _mm256_set1_ps(f);
      for (; j + 32 <= end; j += 32) {
        if (foldable(f) && !any_nan32_rows<1>(&codes, j)) {
#pragma GCC unroll 4
          for (int64_t q = j; q < j + 32; q += 8) {
            fma_group_fp8<kRows>(rows, a, lda, p, decode8_e4m3_finite(codes + q, fv), c, ldc, q);
          }
        } else {
          for (int64_t q = j; q < j + 32; q += 8)
            fma_group_fp8<kRows>(rows, a, lda, p, decode8_e4m3(codes + q, sv), c, ldc, q);
        }
      }
      for (; j < end; j += 8)
        fma_group_fp8<kRows>(rows, a, lda, p, decode8_e4m3(codes + j, sv), c, ldc, j);
    }
    if (full < cols) {
      fma_tail_fp8(rows, a, lda, p, codes + full, cols - full,
                   scale_row[(b.col0 + full) / kFp8Block], c + full, ldc);
    }
  }
}

// The largest low 7 bits so far of the 8G (8, 16 or 32) codes at `row`, per byte lane: a NaN code
// leaves 0x7f.
template <int G>
GROUPLIN_AVX2 inline __m256i top_low7(__m256i top, const uint8_t* row) {
  __m256i v;
  if constexpr (G == 4) {
    v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
  } else if constexpr (G == 2) {
    v = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
  } else {
    static_assert(G == 1);
    v = _mm256_zextsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)));
  }
  return _mm256_max_epu8(top, _mm256_and_si256(v, _mm256_set1_epi8(0x7f)));
}

// c[r][0..8G) += sum over p of a(r, p) * b[p][0..8G) for r < R: the sums held in registers over
// all `depth` rows of b (loaded from c first, stored once at the end), each row of b decoded once
// for all R rows, under one scale, `folded`. Optimistic: the codes are decoded as if none were a
// NaN code while the largest low 7 bits are kept; if one was, nothing is stored and the result is
// false (the caller redoes the strip; c is as it was). The rows at `ahead` are prefetched on the
// way. R x G sums, R broadcasts, one decoded vector and the NaN test: at most 15 of 16 registers.
template <int R, int G>
GROUPLIN_AVX2 inline bool fma_strip_fp8(int64_t depth, const float* a, int64_t lda,
                                        const uint8_t* codes, int64_t ld, __m256 folded, float* c,
                                        int64_t ldc, const uint8_t* ahead) {
  __m256 acc[R][G];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) acc[r][g] = _mm256_loadu_ps(c + r * ldc + 8 * g);
  }
  __m256i top = _mm256_setzero_si256();
  for (int64_t p = 0; p < depth; ++p) {
    const uint8_t* row = codes + p * ld;
    if (ahead != nullptr) _mm_prefetch(reinterpret_cast<const char*>(ahead + p * ld), _MM_HINT_T0);
    top = top_low7<G>(top, row);
    __m256 av[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) av[r] = _mm256_set1_ps(a[r * lda + p]);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m256 bv = decode8_e4m3_finite(row + 8 * g, folded);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][g] = _mm256_fmadd_ps(av[r], bv, acc[r][g]);
    }
  }
  const __m256i nan = _mm256_cmpeq_epi8(top, _mm256_set1_epi8(0x7f));
  if (!_mm256_testz_si256(nan, nan)) return false;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) _mm256_storeu_ps(c + r * ldc + 8 * g, acc[r][g]);
  }
  return true;
}

// Groups of 8 columns per strip for R rows, as many as the registers hold sums for.
template <int R>
inline constexpr int kStripGroups = R == 2 ? 4 : 2;

// depth rows x width columns (a multiple of 8) of b at `codes` under `scale`, a row of b at a time
// with c in memory, NaN codes decoded as NaN.
template <int kRows>
GROUPLIN_AVX2 void fma_block_by_row(int64_t rows, int64_t depth, const float* a, int64_t lda,
                                    const uint8_t* codes, int64_t ld, float scale, int64_t width,
                                    float* c, int64_t ldc) {
  const __m256 sv = _mm256_set1_ps(scale);
  for (int64_t p = 0; p < depth; ++p) {
    for (int64_t j = 0; j < width; j += 8) {
      fma_group_fp8<kRows>(rows, a, lda, p, decode8_e4m3(codes + p * ld + j, sv), c, ldc, j);
    }
  }
}

// One rectangle of b under one scale: depth rows x width columns (a multiple of 8) at `codes`,
// into c's columns [0, width). Each element's chain runs over p in order, as fma_rows_avx2's.
// Strips with their sums in registers (no load and store of c per row of b), each NaN-checked as
// it runs (a separate pass over the rectangle first cost the strips about a fifth); a strip that
// held a NaN code, or a scale that cannot be folded, goes a row of b at a time.
template <int kRows>
GROUPLIN_AVX2 void fma_block_fp8(int64_t rows, int64_t depth, const float* a, int64_t lda,
                                 const uint8_t* codes, int64_t ld, float scale, int64_t width,
                                 float* c, int64_t ldc, const uint8_t* ahead) {
  const float f = folded_scale(scale);
  if (!foldable(f))
    return fma_block_by_row<kRows>(rows, depth, a, lda, codes, ld, scale, width, c, ldc);
  const __m256 fv = _mm256_set1_ps(f);
  constexpr int kGroups = kStripGroups<kRows>;
  for (int64_t j = 0; j < width;) {
    const uint8_t* at = ahead != nullptr ? ahead + j : nullptr;
    const int64_t w = j + 8 * kGroups <= width ? 8 * kGroups : 8;
    const bool done =
        w == 8 ? fma_strip_fp8<kRows, 1>(depth, a, lda, codes + j, ld, fv, c + j, ldc, at)
               : fma_strip_fp8<kRows, kGroups>(depth, a, lda, codes + j, ld, fv, c + j, ldc, at);
    if (!done) fma_block_by_row<kRows>(rows, depth, a, lda, codes + j, ld, scale, w, c + j, ldc);
    j += w;
  }
}

// fma_rows_avx2's products with b decoded from FP8 in registers, in rectangles that each lie
// in one scale block (rows of b in one block of 128, columns in one block of 128; col0 and the
// 8-column groups are multiples of 8). The rectangles of one column go in order of p, so every
// element's chain runs over p in order. The ragged end as fma_row_avx2's (masked loads and
// stores). kRows: 2-4 rows, unrolled (the dgrad of few rows per expert).
template <int kRows>
GROUPLIN_AVX2 void fma_rows_fp8_strips(int64_t rows, int64_t depth, const float* a, int64_t lda,
                                       const Fp8Operand& b, int64_t cols, float* c, int64_t ldc) {
  const int64_t full = cols / 8 * 8;
  for (int64_t p0 = 0, p1 = 0; p0 < depth; p0 = p1) {
    const int64_t row_block = (b.row0 + p0) / kFp8Block;
    p1 = std::min(depth, (row_block + 1) * kFp8Block - b.row0);
    const float* scale_row = b.scales + row_block * b.scale_ld;
    for (int64_t j = 0, end = 0; j < full; j = end) {
      const int64_t block = (b.col0 + j) / kFp8Block;
      end = std::min(full, (block + 1) * kFp8Block - b.col0);
      fma_block_fp8<kRows>(rows, p1 - p0, a + p0, lda, b.codes + p0 * b.ld + j, b.ld,
                           scale_row[block], end - j, c + j, ldc,
                           b.ahead != nullptr ? b.ahead + p0 * b.ld + j : nullptr);
    }
    if (full == cols) continue;
    const float scale = scale_row[(b.col0 + full) / kFp8Block];
    for (int64_t p = p0; p < p1; ++p) {
      fma_tail_fp8(rows, a, lda, p, b.codes + p * b.ld + full, cols - full, scale, c + full, ldc);
    }
  }
}

}  // namespace

GROUPLIN_AVX2 void decode_e4m3_avx2(const uint8_t* src, float scale, float* dst, int64_t n) {
  const __m256 s = _mm256_set1_ps(scale);
  const float f = folded_scale(scale);
  const __m256 fv = _mm256_set1_ps(f);
  int64_t i = 0;
  for (; foldable(f) && i + 32 <= n; i += 32) {
    const bool finite = !any_nan32_rows<1>(&src, i);
    for (int64_t q = i; q < i + 32; q += 8) {
      _mm256_storeu_ps(dst + q,
                       finite ? decode8_e4m3_finite(src + q, fv) : decode8_e4m3(src + q, s));
    }
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, decode8_e4m3(src + i, s));
  if (i < n) portable_kernels().decode_e4m3(src + i, scale, dst + i, n - i);
}

void dot_tile_fp8_avx2(int mr, int nr, int64_t kc, const float* a, int64_t lda, const Fp8Operand& b,
                       float* c, int64_t ldc) {
  kDotFp8Table[mr - 1][nr - 1](kc, a, lda, b, c, ldc);
}

void fma_rows_fp8_avx2(int64_t rows, int64_t depth, const float* a, int64_t lda,
                       const Fp8Operand& b, int64_t cols, float* c, int64_t ldc) {
  // Same bits either way; the choice by rows is measured (docs/PERFORMANCE.md, measurements
  // behind the code's comments).
  switch (rows) {
    case 1:
      return fma_rows_fp8_by_row<1>(rows, depth, a, lda, b, cols, c, ldc);
    case 2:
      return fma_rows_fp8_strips<2>(rows, depth, a, lda, b, cols, c, ldc);
    case 3:
      return fma_rows_fp8_strips<3>(rows, depth, a, lda, b, cols, c, ldc);
    case 4:
      return fma_rows_fp8_strips<4>(rows, depth, a, lda, b, cols, c, ldc);
    default:
      return fma_rows_fp8_by_row<0>(rows, depth, a, lda, b, cols, c, ldc);
  }
}

}  // namespace grouplin::kernels::native
