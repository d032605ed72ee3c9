// One grouped GEMM case (shapes, m_splits, bias) with its inputs and outputs, shared by the kernel
// tests that compare whole grouped GEMMs bit for bit (across layouts, threads, tilings and
// kernel sets).
//
//   Problem a(c, DType::F32, /*stacked=*/false), b(c, DType::F32, true);
//   a.run(c); b.run(c);
//   expect_bit_equal(a, b, c.name);
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "grouplin/tensor.hpp"
#include "kernel_reference.hpp"
#include "kernels/gemm_plan.hpp"
#include "kernels/grouped_gemm.hpp"
#include "kernels/packing.hpp"
#include "kernels/tile_compute.hpp"

namespace grouplin::kernel_test {

struct Case {
  std::string name;
  int64_t in, out;
  std::vector<int64_t> splits;
  bool bias;
};

// Forward (y = x · Wᵀ + b) and dgrad (dx = dy · W) of case c tile by tile, each expert's block cut
// by `shape` instead of the grouped calls' own plan; each tile is told the next, so that its
// prefetching runs too. y and dx (shaped, of x's dtype) are overwritten.
inline void run_by_tiles(const Case& c, const Tensor& x, const Tensor& dy,
                         const std::vector<kernels::MatrixRef>& weights,
                         const std::vector<kernels::MatrixRef>& biases,
                         const kernels::TileShape& shape, Tensor& y, Tensor& dx) {
  const DType dt = x.dtype();
  kernels::ForwardArgs fw;
  fw.x = {x.data(), dt, c.in};
  fw.in_features = c.in;
  fw.expert_rows = c.splits;
  fw.first_row = first_rows(c.splits);
  fw.weights = weights;
  fw.biases = biases;
  fw.y = {y.mutable_data(), dt, c.out};
  kernels::DgradArgs dg;
  dg.dy = {dy.data(), dt, c.out};
  dg.out_features = c.out;
  dg.expert_rows = c.splits;
  dg.weights = weights;
  dg.dx = {dx.mutable_data(), dt, c.in};
  std::vector<kernels::ExpertBlock> fblocks, dblocks;
  for (size_t e = 0; e < c.splits.size(); ++e) {
    fblocks.push_back({fw.first_row[e], c.splits[e], c.out, c.in, 0, shape});
    dblocks.push_back({fw.first_row[e], c.splits[e], c.in, c.out, 0, shape});
  }
  const kernels::TilePlan fplan = kernels::plan_tiles(fblocks);
  const kernels::TilePlan dplan = kernels::plan_tiles(dblocks);
  std::vector<float> scratch(
      std::max(kernels::scratch_floats(fplan), kernels::scratch_floats(dplan)) + 64);
  float* aligned = scratch.data();
  while (reinterpret_cast<uintptr_t>(aligned) % 64 != 0) ++aligned;
  for (size_t i = 0; i < fplan.tiles.size(); ++i) {
    const kernels::Tile* next = i + 1 < fplan.tiles.size() ? &fplan.tiles[i + 1] : nullptr;
    kernels::forward_tile(fw, fplan.tiles[i], next, aligned);
  }
  for (size_t i = 0; i < dplan.tiles.size(); ++i) {
    const kernels::Tile* next = i + 1 < dplan.tiles.size() ? &dplan.tiles[i + 1] : nullptr;
    kernels::dgrad_tile(dg, dplan.tiles[i], next, aligned);
  }
}

// Inputs and outputs of one case in one dtype; weights in separate allocations (as PerExpert) or
// as views of one stacked tensor (as Single and Contiguous).
struct Problem {
  Tensor x, dy, stacked_w, stacked_b;
  std::vector<Tensor> weights, biases;
  Tensor y, dx;
  std::vector<Tensor> wgrads, bgrads;

  Problem(const Case& c, DType dt, bool stacked) {
    const auto n = static_cast<int64_t>(c.splits.size());
    const int64_t t = std::accumulate(c.splits.begin(), c.splits.end(), int64_t{0});
    x = random_tensor({t, c.in}, dt, 1);
    dy = random_tensor({t, c.out}, dt, 2);
    stacked_w = random_tensor({n, c.out, c.in}, dt, 3);
    stacked_b = random_tensor({n, c.out}, dt, 4);
    for (int64_t e = 0; e < n; ++e) {
      weights.push_back(stacked ? stacked_w.select(e) : stacked_w.select(e).clone());
      if (c.bias) biases.push_back(stacked ? stacked_b.select(e) : stacked_b.select(e).clone());
      // Gradients start as garbage (non-zero) to catch elements left unwritten.
      wgrads.push_back(random_tensor({c.out, c.in}, dt, 100 + static_cast<uint64_t>(e)));
      bgrads.push_back(random_tensor({c.out}, dt, 500 + static_cast<uint64_t>(e)));
    }
    y = random_tensor({t, c.out}, dt, 5);
    dx = random_tensor({t, c.in}, dt, 6);
  }

  void run(const Case& c) {
    kernels::grouped_forward(x, c.splits, weights, {}, biases, y);
    kernels::grouped_dgrad(dy, c.splits, weights, {}, dx);
    kernels::grouped_wgrad(x, dy, c.splits, wgrads, false);
    kernels::grouped_bgrad(dy, c.splits, bgrads);
  }
};

inline void expect_bit_equal(const Problem& a, const Problem& b, const std::string& what) {
  EXPECT_TRUE(a.y.bit_equal(b.y)) << what << ": forward";
  EXPECT_TRUE(a.dx.bit_equal(b.dx)) << what << ": dgrad";
  for (size_t e = 0; e < a.wgrads.size(); ++e) {
    EXPECT_TRUE(a.wgrads[e].bit_equal(b.wgrads[e])) << what << ": wgrad " << e;
    EXPECT_TRUE(a.bgrads[e].bit_equal(b.bgrads[e])) << what << ": bgrad " << e;
  }
}

}  // namespace grouplin::kernel_test
