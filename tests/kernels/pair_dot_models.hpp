// Test-only: scalar models of the sums dot_tile_pairs, dot_tile_fp8_pairs, fma_rows_fp8_pairs and
// pair_tile_scaled form (micro_kernels.hpp states their order), built on the instruction's own
// arithmetic (bf16_dot_semantics.hpp). Plain C++: any CPU.
//
//   float want = model_pair_dots(x_row, w_row, in);
//   float want8 = model_fp8_pair_dots(x_row, code_row, scale_row, in);
//   float dx = model_fp8_pair_rows(dy_row, codes + j, in, scales + j / 128, scale_ld, out);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "bf16_dot_semantics.hpp"
#include "grouplin/dtype.hpp"

namespace grouplin::kernel_test {

// The dword of BF16 values v[p] (low half) and v[p + 1], zeros at or past n.
inline uint32_t model_pair(const uint16_t* v, int64_t p, int64_t n) {
  return (p < n ? v[p] : uint32_t{0}) | (p + 1 < n ? uint32_t{v[p + 1]} : uint32_t{0}) << 16;
}

// 16 lane sums added as the kernels add them: lanes l and l + 8, then l + 4, l + 2, l + 1.
inline float model_lane_tree(float (&lanes)[16]) {
  for (int width = 8; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] = lanes[l] + lanes[l + width];
  }
  return lanes[0];
}

// One dot_tile_pairs element: a and b (n values each) in four chains of 16 lane sums of
// vdpbf16ps from +0, block g (depths 32g..32g + 31, zeros past n) into chain g mod 4, lane l
// taking the pair at depths 32g + 2l, 32g + 2l + 1; the chains added as (0 + 1) + (2 + 3).
inline float model_pair_dots(const uint16_t* a, const uint16_t* b, int64_t n) {
  float chains[4][16] = {};
  for (int64_t g = 0; 32 * g < n; ++g) {
    for (int l = 0; l < 16; ++l) {
      const int64_t p = 32 * g + 2 * l;
      float& lane = chains[g % 4][l];
      lane = kernels::emulated::dpbf16_lane(lane, model_pair(a, p, n), model_pair(b, p, n));
    }
  }
  float lanes[16];
  for (int l = 0; l < 16; ++l) {
    lanes[l] = (chains[0][l] + chains[1][l]) + (chains[2][l] + chains[3][l]);
  }
  return model_lane_tree(lanes);
}

// One dot_tile_fp8_pairs element: BF16 a against E4M3 codes (n each; scales[q] the scale of
// depths 128q..128q + 127). Per block q and lane l: t = a vdpbf16ps chain from +0 over the pairs
// at 128q + 32k + 2l, k = 0..3 (codes as their exact BF16 values, zeros past n); then lane =
// fma(t, scales[q], lane).
inline float model_fp8_pair_dots(const uint16_t* a, const uint8_t* codes, const float* scales,
                                 int64_t n) {
  const auto code_pair = [&](int64_t p) {
    const auto bf16 = [&](int64_t i) {
      return i < n ? uint32_t{f32_to_bf16(f8e4m3_to_f32(codes[i]))} : uint32_t{0};
    };
    return bf16(p) | bf16(p + 1) << 16;
  };
  float lanes[16] = {};
  for (int64_t q = 0; 128 * q < n; ++q) {
    for (int l = 0; l < 16; ++l) {
      float t = 0.0f;
      for (int k = 0; k < 4; ++k) {
        const int64_t p = 128 * q + 32 * k + 2 * l;
        t = kernels::emulated::dpbf16_lane(t, model_pair(a, p, n), code_pair(p));
      }
      lanes[l] = std::fma(t, scales[q], lanes[l]);
    }
  }
  return model_lane_tree(lanes);
}

// The BF16 value of E4M3 code c (exact).
inline uint32_t model_code_bf16(uint8_t c) { return f32_to_bf16(f8e4m3_to_f32(c)); }

// One fma_rows_fp8_pairs element: BF16 a (n values) against a column of E4M3 codes (codes[p * ld],
// p < n; scales[q * scale_ld] the scale of rows 128q..128q + 127 there). Per block q: t = a
// vdpbf16ps chain from +0 over the pairs at depths 128q + 2i, 128q + 2i + 1 (i in order; the
// last pair's high halves +0 when n is odd); then s = fma(t, the scale, s), s from +0.
inline float model_fp8_pair_rows(const uint16_t* a, const uint8_t* codes, int64_t ld,
                                 const float* scales, int64_t scale_ld, int64_t n) {
  float s = 0.0f;
  for (int64_t q = 0; 128 * q < n; ++q) {
    float t = 0.0f;
    for (int64_t p = 128 * q; p < std::min(n, 128 * q + 128); p += 2) {
      const uint32_t w = model_code_bf16(codes[p * ld]) |
                         (p + 1 < n ? model_code_bf16(codes[(p + 1) * ld]) : uint32_t{0}) << 16;
      t = kernels::emulated::dpbf16_lane(t, model_pair(a, p, n), w);
    }
    s = std::fma(t, scales[q * scale_ld], s);
  }
  return s;
}

// One pair_tile_scaled element: BF16 a and b (n values each) from `start`: per block q of 128
// depths, t = a vdpbf16ps chain from +0 over the block's pairs in order (the last pair's high
// halves +0 when n is odd), then s = fma(t, scale(q), s).
template <class Scale>
inline float model_scaled_pairs(const uint16_t* a, const uint16_t* b, int64_t n, float start,
                                const Scale& scale) {
  float s = start;
  for (int64_t q = 0; 128 * q < n; ++q) {
    float t = 0.0f;
    for (int64_t p = 128 * q; p < std::min(n, 128 * q + 128); p += 2) {
      t = kernels::emulated::dpbf16_lane(t, model_pair(a, p, n), model_pair(b, p, n));
    }
    s = std::fma(t, scale(q), s);
  }
  return s;
}

}  // namespace grouplin::kernel_test
