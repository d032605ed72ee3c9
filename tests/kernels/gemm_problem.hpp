// One grouped GEMM case (shapes, m_splits, bias) with its inputs and outputs, shared by the kernel
// tests that compare whole grouped GEMMs bit for bit (across layouts, threads, tilings and
// kernel sets).
//
//   Problem a(c, DType::F32, /*stacked=*/false), b(c, DType::F32, true);
//   a.run(c); b.run(c);
//   expect_bit_equal(a, b, c.name);
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "grouplin/tensor.hpp"
#include "kernel_reference.hpp"
#include "kernels/grouped_gemm.hpp"

namespace grouplin::kernel_test {

struct Case {
  std::string name;
  int64_t in, out;
  std::vector<int64_t> splits;
  bool bias;
};

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
