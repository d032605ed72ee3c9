// The expert block's gate (block/gate.hpp) on rows wide enough for whole chunks and a ragged
// tail, over inputs across the activations' range: each value against the definition in double,
// the same bits wherever a column sits in a row, and the derivatives against differences of the
// definition.
#include "block/gate.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gate_reference.hpp"

namespace grouplin {
namespace {

using testing::gate_of;
using testing::gates;

constexpr int64_t kRows = 3;
constexpr int64_t kWidth = 2 * 64 + 7;  // two whole chunks and a tail

bool has_up(const ExpertGate& g) { return g.kind != ExpertGateKind::None; }
int64_t first_out(const ExpertGate& g, int64_t width) { return has_up(g) ? 2 * width : width; }

// Where gate and up of column j sit in a row of h, by expert_block.hpp's definition.
int64_t gate_column(const ExpertGate& g, int64_t j) { return g.interleaved ? 2 * j : j; }
int64_t up_column(const ExpertGate& g, int64_t width, int64_t j) {
  return g.interleaved ? 2 * j + 1 : width + j;
}

// h [rows, first_out] holding gate values from -100 to 100 (the exponential's clamps at 87 and
// 88 inside), zero and tiny ones; up values in [-3, 3]. `spread` false keeps gates in [-6, 6].
std::vector<float> h_values(const ExpertGate& g, bool spread, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> wide(-100.0f, 100.0f), narrow(-6.0f, 6.0f), u(-3.0f, 3.0f);
  const std::vector<float> special = {0.0f,   1e-30f, -1e-30f, 87.5f, -87.5f, 88.5f,
                                      -88.5f, 100.0f, -100.0f, 20.0f, -20.0f};
  std::vector<float> h(static_cast<size_t>(kRows * first_out(g, kWidth)));
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kWidth; ++j) {
      const size_t k = static_cast<size_t>(r * kWidth + j);
      float v = spread ? wide(gen) : narrow(gen);
      if (spread && k % 7 == 0) v = special[(k / 7) % special.size()];
      h[static_cast<size_t>(r * first_out(g, kWidth) + gate_column(g, j))] = v;
      if (has_up(g))
        h[static_cast<size_t>(r * first_out(g, kWidth) + up_column(g, kWidth, j))] = u(gen);
    }
  }
  return h;
}

std::vector<float> floats(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  const Tensor f = t.to(DType::F32);
  std::memcpy(v.data(), f.data(), v.size() * sizeof(float));
  return v;
}

// The same columns, each alone in a row of width 1 ([kRows * kWidth, first_out(1)]).
Tensor one_column_rows(const ExpertGate& g, const Tensor& h) {
  const std::vector<float> v = floats(h);
  std::vector<float> out;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kWidth; ++j) {
      const float* row = v.data() + r * first_out(g, kWidth);
      out.push_back(row[gate_column(g, j)]);
      if (has_up(g)) out.push_back(row[up_column(g, kWidth, j)]);
    }
  }
  return Tensor::from_f32({kRows * kWidth, first_out(g, 1)}, out, h.dtype());
}

std::string name_of(const ExpertGate& g, DType dtype) {
  return "kind " + std::to_string(static_cast<int>(g.kind)) + " act " +
         std::to_string(static_cast<int>(g.activation)) + (g.interleaved ? " interleaved " : " ") +
         std::string(dtype_name(dtype));
}

TEST(ExpertGate, ForwardMatchesTheDefinitionAcrossTheRange) {
  for (const ExpertGate& g : gates()) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(name_of(g, dtype));
      // BF16 rounds the sigmoid's input where PyTorch does, which moves e^-x by up to
      // e^(|x| 2^-9): its values are checked on gates in [-6, 6], their bits on the whole range.
      const bool spread = dtype == DType::F32;
      const Tensor h =
          Tensor::from_f32({kRows, first_out(g, kWidth)}, h_values(g, spread, 5), dtype);
      Tensor a = Tensor::empty({kRows, kWidth}, dtype);
      block::gate_forward(g, h, a);
      const std::vector<float> hv = floats(h), av = floats(a);  // h as rounded to its dtype
      // F32: the exponential within a few ulp; BF16: each step rounded to 8 bits as PyTorch does.
      const double rel = dtype == DType::F32 ? 4e-6 : 4e-2;
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t j = 0; j < kWidth; ++j) {
          const float* row = hv.data() + r * first_out(g, kWidth);
          const double want =
              gate_of(g, row[gate_column(g, j)], has_up(g) ? row[up_column(g, kWidth, j)] : 0.0);
          const double got = av[static_cast<size_t>(r * kWidth + j)];
          // GELU's forms cancel in F32 for negative inputs (1 + erf(x) near 0), as PyTorch's do:
          // an absolute error near an ulp of the input, times up.
          const bool cancels =
              g.activation == ExpertActivation::GELU || g.activation == ExpertActivation::GELUTanh;
          const double slack =
              cancels ? 2e-7 * std::abs(row[gate_column(g, j)]) *
                            std::max(1.0, has_up(g) ? std::abs(row[up_column(g, kWidth, j)]) : 0.0)
                      : 0.0;
          ASSERT_NEAR(got, want, rel * std::abs(want) + slack + 1e-30)
              << "row " << r << " column " << j << " gate " << row[gate_column(g, j)];
        }
      }

      // Each column's value is its own: the same bits in a row of width 1 (the tail path).
      const Tensor wide =
          Tensor::from_f32({kRows, first_out(g, kWidth)}, h_values(g, true, 6), dtype);
      Tensor a_wide = Tensor::empty({kRows, kWidth}, dtype);
      block::gate_forward(g, wide, a_wide);
      Tensor a1 = Tensor::empty({kRows * kWidth, 1}, dtype);
      block::gate_forward(g, one_column_rows(g, wide), a1);
      ASSERT_EQ(floats(a1), floats(a_wide));
    }
  }
}

// NaN and infinite inputs (a diverged model's) go through without anything undefined (the
// sanitizer builds run this): NaN gives NaN, +inf gives +inf where the activation grows to it.
TEST(ExpertGate, NonFiniteInputsGiveNonFiniteValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const ExpertGate& g : gates()) {
    SCOPED_TRACE(name_of(g, DType::F32));
    std::vector<float> h = h_values(g, false, 3);
    const int64_t width = first_out(g, kWidth);
    for (int64_t j = 0; j < kWidth; ++j) {
      h[static_cast<size_t>(gate_column(g, j))] = j % 2 == 0 ? nan : inf;
      if (has_up(g)) h[static_cast<size_t>(up_column(g, kWidth, j))] = 1.0f;
    }
    Tensor a = Tensor::empty({kRows, kWidth}, DType::F32);
    block::gate_forward(g, Tensor::from_f32({kRows, width}, h), a);
    Tensor dh = Tensor::empty({kRows, width}, DType::F32);
    block::gate_backward(
        g, Tensor::from_f32({kRows, width}, h),
        Tensor::from_f32({kRows, kWidth}, std::vector<float>(kRows * kWidth, 1.0f)), dh);
    const std::vector<float> av = floats(a);
    const bool grows = g.limit == inf && g.kind != ExpertGateKind::GluPlusOne;
    for (int64_t j = 0; j < kWidth; ++j) {
      if (j % 2 == 0) {
        EXPECT_TRUE(std::isnan(av[static_cast<size_t>(j)])) << "column " << j;
      } else if (grows) {
        EXPECT_EQ(av[static_cast<size_t>(j)], inf) << "column " << j;
      }
    }
  }
}

TEST(ExpertGate, BackwardMatchesDifferencesOfTheDefinition) {
  for (const ExpertGate& g : gates()) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(name_of(g, dtype));
      const Tensor h =
          Tensor::from_f32({kRows, first_out(g, kWidth)}, h_values(g, false, 9), dtype);
      std::vector<float> da_values(static_cast<size_t>(kRows * kWidth));
      std::mt19937 gen(4);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (float& v : da_values) v = u(gen);
      const Tensor da = Tensor::from_f32({kRows, kWidth}, da_values, dtype);
      Tensor dh = Tensor::empty(h.shape(), dtype);
      block::gate_backward(g, h, da, dh);
      const std::vector<float> hv = floats(h), dav = floats(da), dhv = floats(dh);
      const double rel = dtype == DType::F32 ? 1e-3 : 2e-2;
      for (int64_t r = 0; r < kRows; ++r) {
        const float* row = hv.data() + r * first_out(g, kWidth);
        const float* d_row = dhv.data() + r * first_out(g, kWidth);
        for (int64_t j = 0; j < kWidth; ++j) {
          const double gate = row[gate_column(g, j)];
          const double up = has_up(g) ? row[up_column(g, kWidth, j)] : 0.0;
          const double d = dav[static_cast<size_t>(r * kWidth + j)], eps = 1e-4;
          // Central differences do not hold across a kink: skip inputs next to one.
          const double l = g.limit;
          if (std::abs(gate - l) < 1e-2 || std::abs(std::abs(up) - l) < 1e-2 ||
              std::abs(gate) < 1e-2 ||
              (g.kind == ExpertGateKind::ClampAfter &&
               std::abs(testing::act(g.activation, gate) - l) < 1e-2)) {
            continue;
          }
          const double d_gate =
              d * (gate_of(g, gate + eps, up) - gate_of(g, gate - eps, up)) / (2 * eps);
          EXPECT_NEAR(d_row[gate_column(g, j)], d_gate, rel * (std::abs(d_gate) + 1e-2))
              << "d gate, row " << r << " column " << j << " gate " << gate << " up " << up;
          if (has_up(g)) {
            const double d_up =
                d * (gate_of(g, gate, up + eps) - gate_of(g, gate, up - eps)) / (2 * eps);
            EXPECT_NEAR(d_row[up_column(g, kWidth, j)], d_up, rel * (std::abs(d_up) + 1e-2))
                << "d up, row " << r << " column " << j << " gate " << gate << " up " << up;
          }
        }
      }

      // Each column's derivative is its own: the same bits in a row of width 1.
      const Tensor h1 = one_column_rows(g, h);
      const Tensor da1 = Tensor::from_f32({kRows * kWidth, 1}, floats(da), dtype);
      Tensor dh1 = Tensor::empty(h1.shape(), dtype);
      block::gate_backward(g, h1, da1, dh1);
      ASSERT_EQ(floats(dh1), floats(one_column_rows(g, dh)));
    }
  }
}

}  // namespace
}  // namespace grouplin
