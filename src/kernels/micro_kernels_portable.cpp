// The portable kernel set: plain loops for any CPU (the only set in builds for other
// architectures than x86-64). They spell out the summation order the AVX2 loops follow (dot_tile's
// eight partial sums and their tree, one chain per element in outer_tile and fma_rows) with a
// separate multiply and add where those fuse, so their last bits differ from the x86 sets'.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "grouplin/dtype.hpp"
#include "kernels/micro_kernels.hpp"

namespace grouplin::kernels {
namespace {

// Element `at` of an F32 or (kBf16) BF16 array, as F32 (exact).
template <bool kBf16>
float load_as_f32(const void* src, int64_t at) {
  if constexpr (kBf16) return bf16_to_f32(static_cast<const uint16_t*>(src)[at]);
  return static_cast<const float*>(src)[at];
}
float load_as_f32(const void* src, bool bf16, int64_t at) {
  return bf16 ? load_as_f32<true>(src, at) : load_as_f32<false>(src, at);
}

template <bool kBf16>
void dot_tile_portable(int mr, int nr, int64_t kc, const float* a, int64_t lda, const void* b,
                       int64_t ldb, float* c, int64_t ldc, const void* /*ahead*/) {
  for (int i = 0; i < mr; ++i) {
    for (int j = 0; j < nr; ++j) {
      float lanes[8] = {};
      for (int64_t k = 0; k < kc; ++k)
        lanes[k % 8] += a[i * lda + k] * load_as_f32<kBf16>(b, j * ldb + k);
      const float sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                        ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
      c[i * ldc + j] += sum;
    }
  }
}

template <bool kBf16>
void outer_tile_portable(int mr, int nr, int64_t kc, const float* a, int64_t a_row, int64_t a_step,
                         const void* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int i = 0; i < mr; ++i) {
    for (int j = 0; j < nr; ++j) {
      float acc = accumulate ? c[i * ldc + j] : 0.0f;
      for (int64_t p = 0; p < kc; ++p)
        acc += a[i * a_row + p * a_step] * load_as_f32<kBf16>(b, p * ldb + j);
      c[i * ldc + j] = acc;
    }
  }
}

template <bool kBf16>
void outer_strips_portable(int mr, int strips, int64_t kc, const float* a, int64_t a_row,
                           int64_t a_step, const void* b, int64_t ldb, int64_t b_strip, float* c,
                           int64_t ldc, bool accumulate) {
  const int64_t elem = kBf16 ? 2 : 4;
  for (int s = 0; s < strips; ++s) {
    outer_tile_portable<kBf16>(mr, kOuterCols, kc, a, a_row, a_step,
                               static_cast<const std::byte*>(b) + s * b_strip * elem, ldb,
                               c + s * kOuterCols, ldc, accumulate);
  }
}

template <bool kBf16>
void fma_rows_portable(int64_t rows, int64_t depth, const float* a, int64_t lda, const void* b,
                       int64_t ldb, int64_t cols, float* c, int64_t ldc) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t p = 0; p < depth; ++p) {
      const float av = a[r * lda + p];
      for (int64_t j = 0; j < cols; ++j) c[r * ldc + j] += av * load_as_f32<kBf16>(b, p * ldb + j);
    }
  }
}

template <bool kBf16>
constexpr F32Products kProducts = {.dot_tile = dot_tile_portable<kBf16>,
                                   .dot_tile_wide = nullptr,
                                   .outer_tile = outer_tile_portable<kBf16>,
                                   .outer_strips = outer_strips_portable<kBf16>,
                                   .fma_rows = fma_rows_portable<kBf16>,
                                   .fma_rows_steps = 1};

void add_rows_portable(const void* rows, int64_t row_bytes, int64_t count, bool bf16, int64_t n,
                       float* sums, bool zero) {
  if (zero) std::fill_n(sums, n, 0.0f);
  for (int64_t i = 0; i < count; ++i) {
    const void* row = static_cast<const std::byte*>(rows) + i * row_bytes;
    for (int64_t j = 0; j < n; ++j) sums[j] += load_as_f32(row, bf16, j);
  }
}

void pack_transposed_portable(const void* src, bool bf16, int64_t ld, int rows, int64_t kc,
                              float* dst, int width) {
  for (int64_t p = 0; p < kc; ++p) {
    for (int i = 0; i < width; ++i)
      dst[p * width + i] = i < rows ? load_as_f32(src, bf16, i * ld + p) : 0.0f;
  }
}

void pack_pairs_portable(const uint16_t* src, int64_t ld, int rows, int64_t pairs, uint32_t* dst) {
  for (int64_t r = 0; r < pairs; ++r) {
    for (int j = 0; j < kOuterCols; ++j) {
      dst[r * kOuterCols + j] =
          j < rows ? src[j * ld + 2 * r] | uint32_t{src[j * ld + 2 * r + 1]} << 16 : 0;
    }
  }
}

void pack_pair_rows_portable(const uint16_t* src, int64_t ld, int64_t depth, int64_t cols,
                             uint32_t* dst, int64_t dst_strip) {
  const int64_t panels = (cols + kOuterCols - 1) / kOuterCols;
  for (int64_t r = 0; 2 * r < depth; ++r) {
    const uint16_t* even = src + 2 * r * ld;
    const uint16_t* odd = 2 * r + 1 < depth ? even + ld : nullptr;
    for (int64_t s = 0; s < panels; ++s) {
      for (int64_t j = 0; j < kOuterCols; ++j) {
        const int64_t c = s * kOuterCols + j;
        const uint32_t high = odd != nullptr && c < cols ? uint32_t{odd[c]} << 16 : 0;
        dst[s * dst_strip + r * kOuterCols + j] = c < cols ? even[c] | high : 0;
      }
    }
  }
}

void transpose_portable(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                        int64_t ldd) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) dst[i * ldd + j] = src[j * lds + i];
  }
}

void widen_bf16_portable(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

void narrow_bf16_portable(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void stream_bf16_portable(const float* src, uint16_t* dst, int64_t n) {
  narrow_bf16_portable(src, dst, n);
}

// 16-byte non-temporal stores where dst is aligned (SSE2, which every x86-64 CPU has).
void stream_f32_portable(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__x86_64__)
  for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 16 != 0; ++i) dst[i] = src[i];
  for (; i + 4 <= n; i += 4) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
#endif
  for (; i < n; ++i) dst[i] = src[i];
}

// 16-byte non-temporal stores where dst is aligned, as stream_f32_portable.
void stream_zeros_portable(std::byte* dst, int64_t bytes) {
  int64_t i = 0;
#if defined(__x86_64__)
  for (; i < bytes && reinterpret_cast<uintptr_t>(dst + i) % 16 != 0; ++i) dst[i] = std::byte{0};
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_setzero_si128());
  }
#endif
  std::memset(dst + i, 0, static_cast<size_t>(bytes - i));
}

void decode_e4m3_portable(const uint8_t* src, float scale, float* dst, int64_t n) {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c)
      t[static_cast<size_t>(c)] = f8e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]] * scale;
}

}  // namespace

constexpr MicroKernels kPortable = {.f32 = kProducts<false>,
                                    .bf16 = kProducts<true>,
                                    .dot_tile_fp8 = nullptr,
                                    .max_strips = 1,
                                    .pair_tile = nullptr,
                                    .pair_tile_half = nullptr,
                                    .dot_tile_pairs = nullptr,
                                    .dot_tile_fp8_pairs = nullptr,
                                    .pair_tile_scaled = nullptr,
                                    .pair_rows = 0,
                                    .pair_strips = 0,
                                    .pair_block = nullptr,
                                    .pair_release = nullptr,
                                    .fma_rows_fp8 = nullptr,
                                    .decode_fp8_bf16 = nullptr,
                                    .fma_rows_fp8_pairs = nullptr,
                                    .fma_rows_pairs = nullptr,
                                    .add_rows = add_rows_portable,
                                    .pack_transposed = pack_transposed_portable,
                                    .pack_pairs = pack_pairs_portable,
                                    .pack_pair_rows = pack_pair_rows_portable,
                                    .transpose = transpose_portable,
                                    .widen_bf16 = widen_bf16_portable,
                                    .narrow_bf16 = narrow_bf16_portable,
                                    .stream_bf16 = stream_bf16_portable,
                                    .stream_f32 = stream_f32_portable,
                                    .stream_zeros = stream_zeros_portable,
                                    .decode_e4m3 = decode_e4m3_portable,
                                    .name = "portable"};

const MicroKernels& portable_kernels() { return kPortable; }

}  // namespace grouplin::kernels
