// The AVX-512F set's FP8 kernel (see micro_kernels_avx512.hpp): the dgrad of 1-4 rows per expert
// on FP8 weights, in 16-lane registers, with the AVX2 set's bits. Everything it does not take
// (NaN codes, scales E4M3's 2^120 cannot be folded into, ragged ends, more than four rows) goes
// to the AVX2 set's kernel.
//
// Not measured: this project has had no AVX-512 machine to run it on; tested under emulation
// against the AVX2 set's bits (tests/kernels/emulated_kernels_test.cpp) and, where the CPU has
// AVX-512F, natively. Only what this file defines goes into its object (see
// micro_kernels_avx512.cpp): builtins, not <cmath>.
#include <cstdint>

#include "kernels/micro_kernels_avx512.hpp"
#include "kernels/micro_kernels_x86.hpp"
#include "kernels/x86_intrinsics.hpp"

namespace grouplin::kernels::GROUPLIN_X86_NS {
namespace {

// The scale with E4M3's 2^120 folded in (see the AVX2 set's folded_scale), or NaN where the two
// multiplies must stay apart. Builtins, not <cmath> (see the top of this file).
inline float folded_fp8_scale(float scale) {
  const float folded = scale * 0x1p120f;
  return __builtin_isfinite(folded) || !__builtin_isfinite(scale) ? folded : __builtin_nanf("");
}

// 16 codes (kHalf: 8, lanes 8-15 zero, nothing past src[7] read), none a NaN code, to their
// values times the scale: the AVX2 set's decode (code moved onto F32's bits, one multiply by the
// folded scale), 16 lanes at a time.
template <bool kHalf>
GROUPLIN_AVX512 inline __m512 decode16_e4m3_finite(const uint8_t* src, __m512 folded) {
  const __m128i raw = kHalf ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src))
                            : _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  const __m512i codes = _mm512_maskz_cvtepi8_epi32(0xFFFF, raw);
  const __m512i bits = _mm512_maskz_and_epi32(0xFFFF, _mm512_maskz_slli_epi32(0xFFFF, codes, 20),
                                              _mm512_set1_epi32(static_cast<int>(0x87f00000u)));
  return _mm512_mul_ps(_mm512_castsi512_ps(bits), folded);
}

// The largest low 7 bits so far of the kBytes (8, 16, or a multiple of 32) codes at `row`, per
// byte lane (AVX2's byte operations; AVX-512F has none): a NaN code leaves 0x7f.
template <int kBytes>
GROUPLIN_AVX512 inline __m256i top_low7(__m256i top, const uint8_t* row) {
  const __m256i low = _mm256_set1_epi8(0x7f);
  if constexpr (kBytes % 32 == 0) {
#pragma GCC unroll 4
    for (int i = 0; i < kBytes; i += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i));
      top = _mm256_max_epu8(top, _mm256_and_si256(v, low));
    }
    return top;
  } else {
    static_assert(kBytes == 8 || kBytes == 16);
    const __m128i v = kBytes == 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(row))
                                   : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row));
    return _mm256_max_epu8(top, _mm256_and_si256(_mm256_zextsi128_si256(v), low));
  }
}

// Whether `top` (of top_low7) saw a NaN code.
GROUPLIN_AVX512 inline bool saw_nan(__m256i top) {
  const __m256i nan = _mm256_cmpeq_epi8(top, _mm256_set1_epi8(0x7f));
  return !_mm256_testz_si256(nan, nan);
}

// c[r][0..16G) += sum over p of a(r, p) * b[p][0..16G) for r < R (kHalf, G = 1: 8 columns), the
// sums in registers over all `depth` rows under one folded scale: the AVX2 set's strips, 16 lanes
// wide, as optimistic: a strip that held a NaN code stores nothing and returns false (c is as it
// was). The rows at `ahead` are prefetched on the way. R x G sums, R broadcasts, one decoded
// vector: at most 22 of 32 zmm.
template <int R, int G, bool kHalf>
GROUPLIN_AVX512 inline bool fma_strip_fp8(int64_t depth, const float* a, int64_t lda,
                                          const uint8_t* codes, int64_t ld, __m512 folded, float* c,
                                          int64_t ldc, const uint8_t* ahead) {
  const __mmask16 lanes = kHalf ? 0x00FF : 0xFFFF;
  __m512 acc[R][G];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_maskz_loadu_ps(lanes, c + r * ldc + 16 * g);
  }
  __m256i top = _mm256_setzero_si256();
  for (int64_t p = 0; p < depth; ++p) {
    const uint8_t* row = codes + p * ld;
    if (ahead != nullptr) {
#pragma GCC unroll 2
      for (int i = 0; i < 16 * G; i += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + p * ld + i), _MM_HINT_T0);
      }
    }
    top = top_low7 < kHalf ? 8 : 16 * G > (top, row);
    __m512 av[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) av[r] = _mm512_set1_ps(a[r * lda + p]);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m512 bv = decode16_e4m3_finite<kHalf>(row + 16 * g, folded);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][g] = _mm512_fmadd_ps(av[r], bv, acc[r][g]);
    }
  }
  if (saw_nan(top)) return false;
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) _mm512_mask_storeu_ps(c + r * ldc + 16 * g, lanes, acc[r][g]);
  }
  return true;
}

// Groups of 16 columns per strip for R rows: a whole scale block (8) where the sums fit.
template <int R>
inline constexpr int kFp8StripGroups = R == 2 ? 8 : 4;

// The AVX2 set's fma_rows_fp8 on the rectangle of b at rows [p0, p1), columns [j, j + width).
inline void fma_rows_fp8_avx2_on(int64_t rows, const float* a, int64_t lda, const Fp8Operand& b,
                                 int64_t p0, int64_t p1, int64_t j, int64_t width, float* c,
                                 int64_t ldc) {
  const Fp8Operand part{
      b.codes + p0 * b.ld + j, b.ld, b.scales, b.scale_ld, b.row0 + p0, b.col0 + j};
  native::avx2_set().fma_rows_fp8(rows, p1 - p0, a + p0, lda, part, width, c + j, ldc);
}

// The AVX2 set's rectangles (one scale block of rows x one of columns, each element's chain over
// p in order), 2-4 rows in 16-lane strips. The rest (strips with a NaN code, scales that cannot
// be folded, the ragged last columns) goes to the AVX2 set's kernel, whose bits these are; so do
// more than four rows.
template <int kRows>
GROUPLIN_AVX512 void fma_rows_fp8_strips(const float* a, int64_t lda, const Fp8Operand& b,
                                         int64_t depth, int64_t cols, float* c, int64_t ldc) {
  const int64_t full = cols / 8 * 8;
  for (int64_t p0 = 0, p1 = 0; p0 < depth; p0 = p1) {
    const int64_t row_block = (b.row0 + p0) / kFp8Block;
    p1 =
        depth < (row_block + 1) * kFp8Block - b.row0 ? depth : (row_block + 1) * kFp8Block - b.row0;
    for (int64_t j = 0, end = 0; j < full; j = end) {
      const int64_t block = (b.col0 + j) / kFp8Block;
      end = full < (block + 1) * kFp8Block - b.col0 ? full : (block + 1) * kFp8Block - b.col0;
      const uint8_t* codes = b.codes + p0 * b.ld + j;
      const float f = folded_fp8_scale(b.scales[row_block * b.scale_ld + block]);
      if (__builtin_isnan(f)) {
        fma_rows_fp8_avx2_on(kRows, a, lda, b, p0, p1, j, end - j, c, ldc);
        continue;
      }
      const __m512 fv = _mm512_set1_ps(f);
      constexpr int kGroups = kFp8StripGroups<kRows>;
      for (int64_t q = j, w = 0; q < end; q += w) {
        const int64_t left = end - q;
        w = left >= 16 * kGroups ? 16 * kGroups : left >= 16 ? 16 : 8;
        const uint8_t* at = b.ahead != nullptr ? b.ahead + p0 * b.ld + q : nullptr;
        const uint8_t* from = codes + (q - j);
        const bool done = w == 16 * kGroups
                              ? fma_strip_fp8<kRows, kGroups, false>(p1 - p0, a + p0, lda, from,
                                                                     b.ld, fv, c + q, ldc, at)
                          : w == 16 ? fma_strip_fp8<kRows, 1, false>(p1 - p0, a + p0, lda, from,
                                                                     b.ld, fv, c + q, ldc, at)
                                    : fma_strip_fp8<kRows, 1, true>(p1 - p0, a + p0, lda, from,
                                                                    b.ld, fv, c + q, ldc, at);
        if (!done) fma_rows_fp8_avx2_on(kRows, a, lda, b, p0, p1, q, w, c, ldc);
      }
    }
    if (full < cols) fma_rows_fp8_avx2_on(kRows, a, lda, b, p0, p1, full, cols - full, c, ldc);
  }
}

// One row of c: a row of b at a time, c's row in memory (in L1) while the codes stream in order
// (the AVX2 set's one-row order, which measured ahead of strips there), 16 lanes at a time, in
// pieces of up to 64 codes, each checked for NaN codes before it is decoded (as the AVX2 kernel
// checks 32 at a time). Pieces with one, scales that cannot be folded and the ragged last
// columns go to the AVX2 set's kernel.
GROUPLIN_AVX512 void fma_row_fp8(const float* a, const Fp8Operand& b, int64_t depth, int64_t cols,
                                 float* c) {
  const int64_t full = cols / 8 * 8;
  for (int64_t p = 0; p < depth; ++p) {
    const int64_t row_block = (b.row0 + p) / kFp8Block;
    const uint8_t* row = b.codes + p * b.ld;
    const __m512 av = _mm512_set1_ps(a[p]);
    for (int64_t j = 0, end = 0; j < full; j = end) {
      const int64_t block = (b.col0 + j) / kFp8Block;
      end = full < (block + 1) * kFp8Block - b.col0 ? full : (block + 1) * kFp8Block - b.col0;
      const float f = folded_fp8_scale(b.scales[row_block * b.scale_ld + block]);
      if (__builtin_isnan(f)) {
        fma_rows_fp8_avx2_on(1, a, 1, b, p, p + 1, j, end - j, c, 0);
        continue;
      }
      const __m512 fv = _mm512_set1_ps(f);
      for (int64_t q = j, w = 0; q < end; q += w) {
        w = end - q >= 64 ? 64 : end - q;
        if (b.ahead != nullptr) {
          _mm_prefetch(reinterpret_cast<const char*>(b.ahead + p * b.ld + q), _MM_HINT_T0);
        }
        __m256i top = _mm256_setzero_si256();
        if (w == 64) {
          top = top_low7<64>(top, row + q);
        } else {
          for (int64_t i = 0; i < w; i += 8) top = top_low7<8>(top, row + q + i);
        }
        if (saw_nan(top)) {
          fma_rows_fp8_avx2_on(1, a, 1, b, p, p + 1, q, w, c, 0);
          continue;
        }
        int64_t i = q;
        for (; i + 16 <= q + w; i += 16) {
          const __m512 bv = decode16_e4m3_finite<false>(row + i, fv);
          _mm512_storeu_ps(c + i, _mm512_fmadd_ps(av, bv, _mm512_loadu_ps(c + i)));
        }
        if (i < q + w) {
          const __m512 bv = decode16_e4m3_finite<true>(row + i, fv);
          _mm512_mask_storeu_ps(c + i, 0x00FF,
                                _mm512_fmadd_ps(av, bv, _mm512_maskz_loadu_ps(0x00FF, c + i)));
        }
      }
    }
    if (full < cols) fma_rows_fp8_avx2_on(1, a, 1, b, p, p + 1, full, cols - full, c, 0);
  }
}

}  // namespace

void fma_rows_fp8_avx512(int64_t rows, int64_t depth, const float* a, int64_t lda,
                         const Fp8Operand& b, int64_t cols, float* c, int64_t ldc) {
  switch (rows) {
    case 2:
      return fma_rows_fp8_strips<2>(a, lda, b, depth, cols, c, ldc);
    case 3:
      return fma_rows_fp8_strips<3>(a, lda, b, depth, cols, c, ldc);
    case 4:
      return fma_rows_fp8_strips<4>(a, lda, b, depth, cols, c, ldc);
    case 1:
      return fma_row_fp8(a, b, depth, cols, c);
    default:
      return native::avx2_set().fma_rows_fp8(rows, depth, a, lda, b, cols, c, ldc);
  }
}

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
