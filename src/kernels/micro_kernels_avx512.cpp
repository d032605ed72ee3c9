// The AVX-512F kernel set (x86-64 builds; see micro_kernels_x86.hpp): the outer-product tiles,
// fma_rows and the few-row FP8 dgrad (fma_rows_fp8) on 16-lane registers. Each output element gets
// the fused multiply-adds of the AVX2 set in the same order, so this set's F32 results are the AVX2
// set's, bit for bit; only the register tile is wider (6 rows x 4 strips of 16 columns: 24 of the
// 32 zmm registers hold sums, 4 hold B, 1 the broadcast A value). The dot tiles, bgrad's row sums
// and the data movement stay AVX2's: they are memory-bound, and 8-lane partial sums there keep the
// bits of the AVX2 set.
//
// Not measured: this project has had no AVX-512 machine to run it on. Written for the register
// file and ports of Intel's AVX-512 cores (two 512-bit FMA units, two loads per cycle: per depth
// step, 24 fused multiply-adds against 4 B loads and 6 broadcasts); tested only under emulation
// (tests/kernels/emulated_kernels_test.cpp) and, where the CPU has AVX-512F, natively.
//
// Only what this file defines goes into its object: no standard-library inline functions, whose
// AVX-512 instances the linker could pick for code that runs on any CPU.
#include <cstdint>

#include "kernels/micro_kernels_x86.hpp"
#include "kernels/x86_intrinsics.hpp"

namespace grouplin::kernels::GROUPLIN_X86_NS {
namespace {

#define GROUPLIN_AVX512 GROUPLIN_TARGET("avx512f,avx2,fma")

// 16 values of B from b on: F32, or BF16 bits widened in registers; with kHalf only the first 8
// (lanes 8-15 are zero and nothing past b[7] is read).
template <bool kBf16, bool kHalf>
GROUPLIN_AVX512 inline __m512 load_b16(const void* b) {
  if constexpr (kBf16) {
    __m256i h;
    if constexpr (kHalf) {
      h = _mm256_zextsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(b)));
    } else {
      h = _mm256_loadu_si256(static_cast<const __m256i*>(b));
    }
    // The maskz forms: the unmasked ones start from _mm512_undefined_epi32, on which GCC 12 warns
    // (-Wmaybe-uninitialized) in every caller.
    const __m512i wide = _mm512_maskz_cvtepu16_epi32(0xFFFF, h);
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, wide, 16));
  } else if constexpr (kHalf) {
    return _mm512_maskz_loadu_ps(0x00FF, b);
  } else {
    return _mm512_loadu_ps(b);
  }
}

// MR rows x NS strips: c (+)= A · B, one fused multiply-add chain per element in p order, from
// c's value when `accumulate`, else from +0 (outer_strips in micro_kernels.hpp). kHalf (NS = 1):
// only the first 8 columns are read and written.
template <int MR, int NS, bool kBf16, bool kHalf>
GROUPLIN_AVX512 void outer_fixed(int64_t kc, const float* a, int64_t a_row, int64_t a_step,
                                 const void* b, int64_t ldb, int64_t b_strip, float* c, int64_t ldc,
                                 bool accumulate) {
  const __mmask16 lanes = kHalf ? 0x00FF : 0xFFFF;
  const int64_t elem = kBf16 ? 2 : 4;
  const auto* b_bytes = static_cast<const unsigned char*>(b);
  const int64_t b_row = ldb * elem, strip = b_strip * elem;
  __m512 acc[MR][NS];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) {
      acc[i][s] =
          accumulate ? _mm512_maskz_loadu_ps(lanes, c + i * ldc + 16 * s) : _mm512_setzero_ps();
    }
  }
  for (int64_t p = 0; p < kc; ++p) {
    __m512 bv[NS];
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) bv[s] = load_b16<kBf16, kHalf>(b_bytes + p * b_row + s * strip);
    const float* ap = a + p * a_step;
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(ap[i * a_row]);
#pragma GCC unroll 4
      for (int s = 0; s < NS; ++s) acc[i][s] = _mm512_fmadd_ps(av, bv[s], acc[i][s]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) _mm512_mask_storeu_ps(c + i * ldc + 16 * s, lanes, acc[i][s]);
  }
}

using OuterFixed = void (*)(int64_t, const float*, int64_t, int64_t, const void*, int64_t, int64_t,
                            float*, int64_t, bool);

// One compiled register tile per row count (1-6), strip count (1-4), B dtype and width.
template <int NS, bool kBf16, bool kHalf>
constexpr OuterFixed kByRows[kOuterRows] = {
    outer_fixed<1, NS, kBf16, kHalf>, outer_fixed<2, NS, kBf16, kHalf>,
    outer_fixed<3, NS, kBf16, kHalf>, outer_fixed<4, NS, kBf16, kHalf>,
    outer_fixed<5, NS, kBf16, kHalf>, outer_fixed<6, NS, kBf16, kHalf>};

template <bool kBf16>
OuterFixed pick(int mr, int strips, bool half) {
  if (half) return kByRows<1, kBf16, true>[mr - 1];
  switch (strips) {
    case 1:
      return kByRows<1, kBf16, false>[mr - 1];
    case 2:
      return kByRows<2, kBf16, false>[mr - 1];
    case 3:
      return kByRows<3, kBf16, false>[mr - 1];
    default:
      return kByRows<4, kBf16, false>[mr - 1];
  }
}

void outer_tile_avx512(int mr, int nr, int64_t kc, const float* a, int64_t a_row, int64_t a_step,
                       const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  pick<false>(mr, 1, nr == 8)(kc, a, a_row, a_step, b, ldb, 0, c, ldc, accumulate);
}

void outer_tile_bf16_avx512(int mr, int nr, int64_t kc, const float* a, int64_t a_row,
                            int64_t a_step, const uint16_t* b, int64_t ldb, float* c, int64_t ldc,
                            bool accumulate) {
  pick<true>(mr, 1, nr == 8)(kc, a, a_row, a_step, b, ldb, 0, c, ldc, accumulate);
}

void outer_strips_avx512(int mr, int strips, int64_t kc, const float* a, int64_t a_row,
                         int64_t a_step, const float* b, int64_t ldb, int64_t b_strip, float* c,
                         int64_t ldc, bool accumulate) {
  pick<false>(mr, strips, false)(kc, a, a_row, a_step, b, ldb, b_strip, c, ldc, accumulate);
}

void outer_strips_bf16_avx512(int mr, int strips, int64_t kc, const float* a, int64_t a_row,
                              int64_t a_step, const uint16_t* b, int64_t ldb, int64_t b_strip,
                              float* c, int64_t ldc, bool accumulate) {
  pick<true>(mr, strips, false)(kc, a, a_row, a_step, b, ldb, b_strip, c, ldc, accumulate);
}

// The first n (< 16) values of B from b on, zero beyond: F32 by a masked load, BF16 bits widened
// through a small buffer (a masked 16-bit load would need AVX512BW).
template <bool kBf16>
GROUPLIN_AVX512 inline __m512 load_b_tail(const void* b, int64_t n, __mmask16 mask) {
  if constexpr (kBf16) {
    const auto* src = static_cast<const uint16_t*>(b);
    alignas(64) uint32_t bits[16] = {};
    for (int64_t i = 0; i < n; ++i) bits[i] = uint32_t{src[i]} << 16;
    return _mm512_load_ps(bits);
  } else {
    return _mm512_maskz_loadu_ps(mask, b);
  }
}

// c[j] += av * b[j] for j < cols: 64 columns per step, then 16, then a masked tail, so that
// every element gets one fused multiply-add (the AVX2 set's, 16 lanes at a time).
template <bool kBf16>
GROUPLIN_AVX512 inline void fma_row(float av_scalar, const unsigned char* bp, float* cr,
                                    int64_t cols, __mmask16 tail) {
  const int64_t elem = kBf16 ? 2 : 4;
  const __m512 av = _mm512_set1_ps(av_scalar);
  const int64_t full = cols / 16 * 16;
  int64_t j = 0;
  for (; j + 64 <= full; j += 64) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      float* cv = cr + j + 16 * v;
      const __m512 bv = load_b16<kBf16, false>(bp + (j + 16 * v) * elem);
      _mm512_storeu_ps(cv, _mm512_fmadd_ps(av, bv, _mm512_loadu_ps(cv)));
    }
  }
  for (; j < full; j += 16) {
    const __m512 bv = load_b16<kBf16, false>(bp + j * elem);
    _mm512_storeu_ps(cr + j, _mm512_fmadd_ps(av, bv, _mm512_loadu_ps(cr + j)));
  }
  if (j < cols) {
    const __m512 bv = load_b_tail<kBf16>(bp + j * elem, cols - j, tail);
    _mm512_mask_storeu_ps(cr + j, tail,
                          _mm512_fmadd_ps(av, bv, _mm512_maskz_loadu_ps(tail, cr + j)));
  }
}

// The loop orders of the AVX2 set's fma_rows (the same chains either way; the order only picks
// what stays in L1).
template <bool kBf16>
GROUPLIN_AVX512 void fma_rows_impl(int64_t rows, int64_t depth, const float* a, int64_t lda,
                                   const void* b, int64_t ldb, int64_t cols, float* c,
                                   int64_t ldc) {
  const auto tail = static_cast<__mmask16>((1u << (cols % 16)) - 1);
  const int64_t row_bytes = ldb * (kBf16 ? 2 : 4);
  const auto* bytes = static_cast<const unsigned char*>(b);
  if (depth > rows) {
    for (int64_t p = 0; p < depth; ++p) {
      for (int64_t r = 0; r < rows; ++r)
        fma_row<kBf16>(a[r * lda + p], bytes + p * row_bytes, c + r * ldc, cols, tail);
    }
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t p = 0; p < depth; ++p)
        fma_row<kBf16>(a[r * lda + p], bytes + p * row_bytes, c + r * ldc, cols, tail);
    }
  }
}

void fma_rows_avx512(int64_t rows, int64_t depth, const float* a, int64_t lda, const float* b,
                     int64_t ldb, int64_t cols, float* c, int64_t ldc) {
  fma_rows_impl<false>(rows, depth, a, lda, b, ldb, cols, c, ldc);
}

void fma_rows_bf16_avx512(int64_t rows, int64_t depth, const float* a, int64_t lda,
                          const uint16_t* b, int64_t ldb, int64_t cols, float* c, int64_t ldc) {
  fma_rows_impl<true>(rows, depth, a, lda, b, ldb, cols, c, ldc);
}

// ---- FP8 weights: the dgrad of 2-4 rows per expert ----

// The scale with E4M3's 2^120 folded in (see the AVX2 set's folded_scale), or NaN where the two
// multiplies must stay apart. Builtins, not <cmath>: see the note at the top of this file.
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

// Whether any code of the depth x width rectangle at `codes` (width a multiple of 8) is a NaN
// code (low 7 bits all set), checked with AVX2's byte operations (AVX-512F has none); the rows at
// `ahead` prefetched on the way.
GROUPLIN_AVX512 inline bool any_nan_code(const uint8_t* codes, int64_t ld, int64_t depth,
                                         int64_t width, const uint8_t* ahead) {
  const __m256i low = _mm256_set1_epi8(0x7f);
  __m256i top = _mm256_setzero_si256();
  for (int64_t p = 0; p < depth; ++p) {
    const uint8_t* row = codes + p * ld;
    if (ahead != nullptr) {
      for (int64_t j = 0; j < width; j += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + p * ld + j), _MM_HINT_T0);
      }
    }
    int64_t j = 0;
    for (; j + 32 <= width; j += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + j));
      top = _mm256_max_epu8(top, _mm256_and_si256(v, low));
    }
    for (; j < width; j += 8) {  // the upper 24 bytes load as zero, never a NaN code
      const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + j));
      top = _mm256_max_epu8(top, _mm256_and_si256(_mm256_zextsi128_si256(v), low));
    }
  }
  const __m256i hit = _mm256_cmpeq_epi8(top, low);
  return !_mm256_testz_si256(hit, hit);
}

// c[r][0..16G) += sum over p of a(r, p) * b[p][0..16G) for r < R (kHalf, G = 1: 8 columns), the
// sums in registers over all `depth` rows of clean codes under one folded scale: the AVX2 set's
// strips, 16 lanes wide. R x G sums, R broadcasts, one decoded vector: at most 22 of 32 zmm.
template <int R, int G, bool kHalf>
GROUPLIN_AVX512 inline void fma_strip_fp8(int64_t depth, const float* a, int64_t lda,
                                          const uint8_t* codes, int64_t ld, __m512 folded, float* c,
                                          int64_t ldc) {
  const __mmask16 lanes = kHalf ? 0x00FF : 0xFFFF;
  __m512 acc[R][G];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_maskz_loadu_ps(lanes, c + r * ldc + 16 * g);
  }
  for (int64_t p = 0; p < depth; ++p) {
    const uint8_t* row = codes + p * ld;
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
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) _mm512_mask_storeu_ps(c + r * ldc + 16 * g, lanes, acc[r][g]);
  }
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
// p in order), the clean ones of 2-4 rows in 16-lane strips. Everything else (one row or more
// than four, NaN codes, a scale that cannot be folded, the ragged last columns) goes to the AVX2
// set's kernel, whose bits these are.
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
      if (__builtin_isnan(f) ||
          any_nan_code(codes, b.ld, p1 - p0, end - j,
                       b.ahead != nullptr ? b.ahead + p0 * b.ld + j : nullptr)) {
        fma_rows_fp8_avx2_on(kRows, a, lda, b, p0, p1, j, end - j, c, ldc);
        continue;
      }
      const __m512 fv = _mm512_set1_ps(f);
      constexpr int kGroups = kFp8StripGroups<kRows>;
      int64_t q = j;
      for (; q + 16 * kGroups <= end; q += 16 * kGroups) {
        fma_strip_fp8<kRows, kGroups, false>(p1 - p0, a + p0, lda, codes + (q - j), b.ld, fv, c + q,
                                             ldc);
      }
      for (; q + 16 <= end; q += 16) {
        fma_strip_fp8<kRows, 1, false>(p1 - p0, a + p0, lda, codes + (q - j), b.ld, fv, c + q, ldc);
      }
      if (q < end) {
        fma_strip_fp8<kRows, 1, true>(p1 - p0, a + p0, lda, codes + (q - j), b.ld, fv, c + q, ldc);
      }
    }
    if (full < cols) fma_rows_fp8_avx2_on(kRows, a, lda, b, p0, p1, full, cols - full, c, ldc);
  }
}

void fma_rows_fp8_avx512(int64_t rows, int64_t depth, const float* a, int64_t lda,
                         const Fp8Operand& b, int64_t cols, float* c, int64_t ldc) {
  switch (rows) {
    case 2:
      return fma_rows_fp8_strips<2>(a, lda, b, depth, cols, c, ldc);
    case 3:
      return fma_rows_fp8_strips<3>(a, lda, b, depth, cols, c, ldc);
    case 4:
      return fma_rows_fp8_strips<4>(a, lda, b, depth, cols, c, ldc);
    default:  // one row: c's row stays in L1 while the codes stream in order (measured on AVX2)
      return native::avx2_set().fma_rows_fp8(rows, depth, a, lda, b, cols, c, ldc);
  }
}

}  // namespace

void add_avx512(MicroKernels& set) {
  set.outer_tile = outer_tile_avx512;
  set.outer_tile_bf16 = outer_tile_bf16_avx512;
  set.outer_strips = outer_strips_avx512;
  set.outer_strips_bf16 = outer_strips_bf16_avx512;
  set.max_strips = kMaxStrips;
  set.fma_rows = fma_rows_avx512;
  set.fma_rows_bf16 = fma_rows_bf16_avx512;
  set.fma_rows_fp8 = fma_rows_fp8_avx512;
  set.name = "avx512f";
}

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
