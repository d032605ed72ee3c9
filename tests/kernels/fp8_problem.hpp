// Grouped GEMMs on FP8 weights (F8_E4M3 codes with one F32 scale per 128 x 128 block) against the
// same GEMMs on F32 weights holding the dequantized values, beside activations of either dtype:
// forward and dgrad must give the same bits on whichever kernel set runs both, since the kernels
// decode FP8 as they read it; except with BF16 activations on a set with the FP8 pair kernels,
// where the FP8 pair kernels (dot_tile_fp8_pairs, fma_rows_fp8_pairs, pair_tile_scaled) sum
// block by block and must give the bits of their models (pair_dot_models.hpp).
//
//   Fp8Problem p(case, DType::BF16);
//   p.expect_dequantized_bits("amx");
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

#include "gemm_problem.hpp"
#include "grouplin/dtype.hpp"
#include "grouplin/tensor.hpp"
#include "kernel_reference.hpp"
#include "kernels/gemm_plan.hpp"
#include "kernels/grouped_gemm.hpp"
#include "kernels/micro_kernels.hpp"
#include "kernels/tile_compute.hpp"
#include "pair_dot_models.hpp"

namespace grouplin::kernel_test {

// Cases that reach every forward and dgrad path: dot tiles (1-3 rows; up to 8 for F32), packed and
// tiles, the broadcast path with dot tails, dgrad's unpacked and packed paths; the FP8 pair
// kernels' (dot and row kernels up to 12 and 8 rows, scaled pair tiles beyond: turned up to 48
// rows, packed weights at 100); features off the 128 grid, so that blocks and tiles end
// mid-block, and odd, so that the last pair of a depth is half empty.
inline std::vector<Case> fp8_cases() {
  return {
      {"few_rows", 300, 200, {1, 2, 3, 4, 0, 5}, true},
      {"many_rows", 261, 139, {9, 13, 17, 40, 100}, false},
  };
}

struct Fp8Problem {
  Tensor x, dy;
  std::vector<Tensor> codes, scales, dequantized, biases;
  Tensor y, dx, y_want, dx_want;

  Fp8Problem(const Case& c, DType dt) {
    const auto n = static_cast<int64_t>(c.splits.size());
    const int64_t t = std::accumulate(c.splits.begin(), c.splits.end(), int64_t{0});
    const int64_t bo = (c.out + 127) / 128, bi = (c.in + 127) / 128;
    x = random_tensor({t, c.in}, dt, 1);
    dy = random_tensor({t, c.out}, dt, 2);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    auto next = [&] {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<uint32_t>(state >> 33);
    };
    for (int64_t e = 0; e < n; ++e) {
      Tensor w = Tensor::zeros({c.out, c.in}, DType::F8_E4M3);
      auto* q = reinterpret_cast<uint8_t*>(w.mutable_data());
      for (int64_t k = 0; k < w.numel(); ++k) q[k] = finite_e4m3(static_cast<uint8_t>(next()));
      Tensor s = Tensor::zeros({bo, bi}, DType::F32);
      auto* sf = s.mutable_data_as<float>();
      for (int64_t k = 0; k < s.numel(); ++k) {
        sf[k] = std::ldexp(1.0f + static_cast<float>(next() % 97) / 97.0f,
                           static_cast<int>(next() % 9) - 10);
      }
      Tensor d = Tensor::zeros({c.out, c.in}, DType::F32);
      for (int64_t r = 0; r < c.out; ++r) {
        for (int64_t k = 0; k < c.in; ++k) {
          d.mutable_data_as<float>()[r * c.in + k] =
              f8e4m3_to_f32(q[r * c.in + k]) * sf[(r / 128) * bi + k / 128];
        }
      }
      codes.push_back(w);
      scales.push_back(s);
      dequantized.push_back(d);
      if (c.bias) biases.push_back(random_tensor({c.out}, dt, 40 + static_cast<uint64_t>(e)));
    }
    y = random_tensor({t, c.out}, dt, 5);
    y_want = random_tensor({t, c.out}, dt, 6);
    dx = random_tensor({t, c.in}, dt, 7);
    dx_want = random_tensor({t, c.in}, dt, 8);
  }

  // Runs both on the current kernel set and expects the same bits.
  void expect_dequantized_bits(const Case& c, const std::string& what) {
    kernels::grouped_forward(x, c.splits, codes, scales, biases, y);
    kernels::grouped_forward(x, c.splits, dequantized, {}, biases, y_want);
    if (x.dtype() == DType::BF16 && kernels::micro_kernels().dot_tile_fp8_pairs != nullptr) {
      set_block_scaled_rows(c);
    }
    kernels::grouped_dgrad(dy, c.splits, codes, scales, dx);
    kernels::grouped_dgrad(dy, c.splits, dequantized, {}, dx_want);
    if (dy.dtype() == DType::BF16 && kernels::micro_kernels().fma_rows_fp8_pairs != nullptr) {
      set_block_scaled_dgrad_rows(c);
    }
    EXPECT_TRUE(y.bit_equal(y_want)) << what << ": forward";
    EXPECT_TRUE(dx.bit_equal(dx_want)) << what << ": dgrad";
  }

  // Forward and dgrad tile by tile, with tiles of each of `shapes` (columns cut on the 16-column
  // strips FP8 dgrad requires), give the bits of the grouped calls, which plan their own tiles:
  // every path sums an element the same way in any tile (block scales change mid tile).
  void expect_same_bits_by_tiles(const Case& c, std::initializer_list<kernels::TileShape> shapes) {
    kernels::grouped_forward(x, c.splits, codes, scales, biases, y);
    kernels::grouped_dgrad(dy, c.splits, codes, scales, dx);
    const DType dt = x.dtype();
    std::vector<kernels::MatrixRef> weights, bias_refs;
    for (size_t e = 0; e < c.splits.size(); ++e) {
      weights.push_back(
          {codes[e].data(), DType::F8_E4M3, c.in, scales[e].data_as<float>(), scales[e].dim(1)});
      if (c.bias) bias_refs.push_back({biases[e].data(), dt, c.out});
    }
    for (const kernels::TileShape& shape : shapes) {
      Tensor yt = Tensor::zeros(y.shape(), dt), dxt = Tensor::zeros(dx.shape(), dt);
      run_by_tiles(c, x, dy, weights, bias_refs, shape, yt, dxt);
      EXPECT_TRUE(yt.bit_equal(y)) << "forward, tiles " << shape.rows << "x" << shape.cols;
      EXPECT_TRUE(dxt.bit_equal(dx)) << "dgrad, tiles " << shape.rows << "x" << shape.cols;
    }
  }

  // Calls f(e, r, codes, scales) for each row r of each expert e.
  template <typename F>
  void each_row(const Case& c, F f) const {
    int64_t row = 0;
    for (size_t e = 0; e < c.splits.size(); row += c.splits[e], ++e) {
      const auto* q = reinterpret_cast<const uint8_t*>(codes[e].data());
      for (int64_t r = row; r < row + c.splits[e]; ++r) f(e, r, q, scales[e].data_as<float>());
    }
  }

  // Sets y_want by the model of dot_tile_fp8_pairs (experts of a few rows) or pair_tile_scaled
  // (more: fma_rows_fp8_pairs' chain along a weight row), plus the bias, rounded to BF16 once,
  // as every BF16 forward stores.
  void set_block_scaled_rows(const Case& c) {
    const int64_t bi = (c.in + 127) / 128;
    const auto* xs = reinterpret_cast<const uint16_t*>(x.data());
    auto* want = reinterpret_cast<uint16_t*>(y_want.mutable_data());
    each_row(c, [&](size_t e, int64_t r, const uint8_t* q, const float* sf) {
      const bool dots = kernels::fp8_forward_dots(c.splits[e]);
      for (int64_t o = 0; o < c.out; ++o) {
        const uint16_t* xr = xs + r * c.in;
        const float* row_scales = sf + (o / 128) * bi;
        float v = dots ? model_fp8_pair_dots(xr, q + o * c.in, row_scales, c.in)
                       : model_fp8_pair_rows(xr, q + o * c.in, 1, row_scales, 1, c.in);
        if (c.bias) v += bf16_to_f32(reinterpret_cast<const uint16_t*>(biases[e].data())[o]);
        want[r * c.out + o] = f32_to_bf16(v);
      }
    });
  }

  // Sets dx_want by the model of fma_rows_fp8_pairs (rounded to BF16 once).
  void set_block_scaled_dgrad_rows(const Case& c) {
    const int64_t bi = (c.in + 127) / 128;
    const auto* dys = reinterpret_cast<const uint16_t*>(dy.data());
    auto* want = reinterpret_cast<uint16_t*>(dx_want.mutable_data());
    each_row(c, [&](size_t, int64_t r, const uint8_t* q, const float* sf) {
      for (int64_t k = 0; k < c.in; ++k) {
        want[r * c.in + k] =
            f32_to_bf16(model_fp8_pair_rows(dys + r * c.out, q + k, c.in, sf + k / 128, bi, c.out));
      }
    });
  }
};

}  // namespace grouplin::kernel_test
