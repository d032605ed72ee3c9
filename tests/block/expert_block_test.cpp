// The expert block against a plain reference in double: every gate, both weight orientations,
// biases, sentinels; gradients against central differences of that reference; the same bits for
// one and two threads; FP8 weights as F32 weights of their values; every bad argument named.
#include "grouplin/expert_block.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/fp8.hpp"
#include "error_of.hpp"
#include "gate_reference.hpp"
#include "grouplin/runtime.hpp"

namespace grouplin {
namespace {

using testing::error_of;
using testing::gate_of;
using testing::gates;

// One block's inputs in double; weights in [out, in] order, whatever the orientation tested.
struct Problem {
  int64_t experts = 3, hidden = 8, width = 6, tokens = 5, top_k = 2;
  ExpertGate gate;
  bool transposed = false, bias = false;
  std::vector<double> first, down, first_bias, down_bias, x, routing;
  std::vector<int64_t> ids;

  int64_t first_out() const { return gate.kind == ExpertGateKind::None ? width : 2 * width; }
};

Problem make_problem(ExpertGate gate, bool transposed, bool bias, uint32_t seed) {
  Problem p;
  p.gate = gate;
  p.transposed = transposed;
  p.bias = bias;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  auto fill = [&](std::vector<double>& v, int64_t n, double scale) {
    v.resize(static_cast<size_t>(n));
    for (double& d : v) d = static_cast<double>(static_cast<float>(u(gen) * scale));
  };
  fill(p.first, p.experts * p.first_out() * p.hidden, 0.6);
  fill(p.down, p.experts * p.hidden * p.width, 0.6);
  fill(p.first_bias, bias ? p.experts * p.first_out() : 0, 0.3);
  fill(p.down_bias, bias ? p.experts * p.hidden : 0, 0.3);
  fill(p.x, p.tokens * p.hidden, 1.0);
  fill(p.routing, p.tokens * p.top_k, 1.0);
  // Every expert used, one used twice by a token's neighbours, one sentinel (id E) slot.
  p.ids = {0, 2, 1, 0, 2, 1, 0, 3, 2, 0};
  return p;
}

// out [T, H] of the block, by the definition in expert_block.hpp.
std::vector<double> reference(const Problem& p) {
  std::vector<double> out(static_cast<size_t>(p.tokens * p.hidden), 0.0);
  const int64_t fo = p.first_out();
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int64_t k = 0; k < p.top_k; ++k) {
      const int64_t e = p.ids[static_cast<size_t>(t * p.top_k + k)];
      if (e >= p.experts) continue;
      std::vector<double> h(static_cast<size_t>(fo)), a(static_cast<size_t>(p.width));
      for (int64_t o = 0; o < fo; ++o) {
        double s = p.bias ? p.first_bias[static_cast<size_t>(e * fo + o)] : 0.0;
        for (int64_t i = 0; i < p.hidden; ++i) {
          s += p.x[static_cast<size_t>(t * p.hidden + i)] *
               p.first[static_cast<size_t>((e * fo + o) * p.hidden + i)];
        }
        h[static_cast<size_t>(o)] = s;
      }
      for (int64_t j = 0; j < p.width; ++j) {
        const bool none = p.gate.kind == ExpertGateKind::None;
        const int64_t gi = p.gate.interleaved ? 2 * j : j;
        const int64_t ui = p.gate.interleaved ? 2 * j + 1 : p.width + j;
        a[static_cast<size_t>(j)] =
            gate_of(p.gate, h[static_cast<size_t>(gi)], none ? 0.0 : h[static_cast<size_t>(ui)]);
      }
      const double w = p.routing[static_cast<size_t>(t * p.top_k + k)];
      for (int64_t o = 0; o < p.hidden; ++o) {
        double s = p.bias ? p.down_bias[static_cast<size_t>(e * p.hidden + o)] : 0.0;
        for (int64_t j = 0; j < p.width; ++j) {
          s += a[static_cast<size_t>(j)] *
               p.down[static_cast<size_t>((e * p.hidden + o) * p.width + j)];
        }
        out[static_cast<size_t>(t * p.hidden + o)] += w * s;
      }
    }
  }
  return out;
}

std::vector<float> as_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// [E, out, in] values as stored: [E, in, out] when transposed.
Tensor stacked(const std::vector<double>& v, int64_t e, int64_t out, int64_t in, bool transposed,
               DType dtype) {
  if (!transposed) return Tensor::from_f32({e, out, in}, as_float(v), dtype);
  std::vector<float> t(v.size());
  for (int64_t x = 0; x < e; ++x) {
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        t[static_cast<size_t>((x * in + i) * out + o)] =
            static_cast<float>(v[static_cast<size_t>((x * out + o) * in + i)]);
      }
    }
  }
  return Tensor::from_f32({e, in, out}, t, dtype);
}

struct Inputs {
  Tensor first, down, first_bias, down_bias, hidden, index, routing;
};

Inputs inputs_of(const Problem& p, DType dtype) {
  Inputs in;
  in.first = stacked(p.first, p.experts, p.first_out(), p.hidden, p.transposed, dtype);
  in.down = stacked(p.down, p.experts, p.hidden, p.width, p.transposed, dtype);
  if (p.bias) {
    in.first_bias = Tensor::from_f32({p.experts, p.first_out()}, as_float(p.first_bias), dtype);
    in.down_bias = Tensor::from_f32({p.experts, p.hidden}, as_float(p.down_bias), dtype);
  }
  in.hidden = Tensor::from_f32({p.tokens, p.hidden}, as_float(p.x), dtype);
  in.index = Tensor::zeros({p.tokens, p.top_k}, DType::I64);
  std::copy(p.ids.begin(), p.ids.end(), in.index.mutable_data_as<int64_t>());
  in.routing = Tensor::from_f32({p.tokens, p.top_k}, as_float(p.routing), DType::F32);
  return in;
}

ExpertBlockWeights weights_of(const Inputs& in, bool transposed) {
  return {ExpertWeights::stacked(in.first, {}, in.first_bias),
          ExpertWeights::stacked(in.down, {}, in.down_bias), transposed};
}

std::vector<double> values(const Tensor& t) {
  const Tensor f = t.to(DType::F32);
  return {f.data_as<float>(), f.data_as<float>() + f.numel()};
}

double largest(const std::vector<double>& v) {
  double m = 0;
  for (double d : v) m = std::max(m, std::abs(d));
  return m;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double bound = rel * std::max(largest(want), 1e-3);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], bound) << what << " [" << i << "]";
  }
}

std::string name_of(const ExpertGate& g, bool transposed, bool bias) {
  return "kind " + std::to_string(static_cast<int>(g.kind)) + " act " +
         std::to_string(static_cast<int>(g.activation)) + (g.interleaved ? " interleaved" : "") +
         (transposed ? " transposed" : "") + (bias ? " bias" : "");
}

TEST(ExpertBlock, ForwardMatchesTheDefinitionForEveryGate) {
  for (const ExpertGate& g : gates()) {
    for (bool transposed : {false, true}) {
      for (bool bias : {false, true}) {
        SCOPED_TRACE(name_of(g, transposed, bias));
        const Problem p = make_problem(g, transposed, bias, 7);
        const Inputs in = inputs_of(p, DType::F32);
        const ExpertBlockResult r =
            expert_block_forward(in.hidden, in.index, in.routing, weights_of(in, transposed), g);
        expect_close(values(r.out), reference(p), 2e-6, "out");
        EXPECT_FALSE(r.saved.h.defined());  // nothing kept unless asked

        // BF16: every step rounded as PyTorch's BF16 rounds; close to the F32 definition.
        Inputs b = inputs_of(p, DType::BF16);
        b.routing = b.routing.to(DType::BF16);  // BF16 products, as two BF16 tensors multiply
        const ExpertBlockResult rb =
            expert_block_forward(b.hidden, b.index, b.routing, weights_of(b, transposed), g);
        EXPECT_EQ(rb.out.dtype(), DType::BF16);
        expect_close(values(rb.out), reference(p), 4e-2, "bf16 out");
      }
    }
  }
}

// dL/dθ of L = Σ out · d_out by central differences of the double reference.
std::vector<double> numeric_grad(Problem p, std::vector<double> Problem::*field,
                                 const std::vector<double>& d_out) {
  std::vector<double> g((p.*field).size());
  auto loss = [&] {
    const std::vector<double> out = reference(p);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * d_out[i];
    return l;
  };
  for (size_t i = 0; i < g.size(); ++i) {
    const double keep = (p.*field)[i], eps = 1e-6;
    (p.*field)[i] = keep + eps;
    const double up = loss();
    (p.*field)[i] = keep - eps;
    const double dn = loss();
    (p.*field)[i] = keep;
    g[i] = (up - dn) / (2 * eps);
  }
  return g;
}

// A gradient given stacked in storage orientation, as [E, out, in] values.
std::vector<double> unstacked(const Tensor& t, bool transposed) {
  std::vector<double> v = values(t);
  if (!transposed) return v;
  const int64_t e = t.dim(0), in = t.dim(1), out = t.dim(2);
  std::vector<double> r(v.size());
  for (int64_t x = 0; x < e; ++x) {
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        r[static_cast<size_t>((x * out + o) * in + i)] =
            v[static_cast<size_t>((x * in + i) * out + o)];
      }
    }
  }
  return r;
}

TEST(ExpertBlock, BackwardMatchesDifferencesOfTheDefinition) {
  for (const ExpertGate& g : gates()) {
    for (bool transposed : {false, true}) {
      const bool bias = transposed;  // biases with one orientation each way
      SCOPED_TRACE(name_of(g, transposed, bias));
      const Problem p = make_problem(g, transposed, bias, 11);
      const Inputs in = inputs_of(p, DType::F32);
      const ExpertBlockWeights w = weights_of(in, transposed);
      const ExpertBlockResult r = expert_block_forward(in.hidden, in.index, in.routing, w, g, true);
      std::vector<double> d_out;
      std::mt19937 gen(3);
      std::uniform_real_distribution<double> u(-1, 1);
      for (int64_t i = 0; i < p.tokens * p.hidden; ++i) {
        d_out.push_back(static_cast<double>(static_cast<float>(u(gen))));
      }
      const Tensor dy = Tensor::from_f32({p.tokens, p.hidden}, as_float(d_out));
      const ExpertBlockGrads grads =
          expert_block_backward(dy, in.hidden, in.routing, w, g, r.saved);
      const double rel = 2e-4;
      expect_close(values(grads.hidden), numeric_grad(p, &Problem::x, d_out), rel, "d hidden");
      std::vector<double> d_routing = numeric_grad(p, &Problem::routing, d_out);
      d_routing[7] = 0;  // the sentinel slot: no gradient, as in the reference
      expect_close(values(grads.top_k_weights), d_routing, rel, "d top_k_weights");
      expect_close(unstacked(grads.first, transposed), numeric_grad(p, &Problem::first, d_out), rel,
                   "d first");
      expect_close(unstacked(grads.down, transposed), numeric_grad(p, &Problem::down, d_out), rel,
                   "d down");
      if (bias) {
        expect_close(values(grads.first_bias), numeric_grad(p, &Problem::first_bias, d_out), rel,
                     "d first bias");
        expect_close(values(grads.down_bias), numeric_grad(p, &Problem::down_bias, d_out), rel,
                     "d down bias");
      } else {
        EXPECT_FALSE(grads.first_bias.defined());
      }
    }
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::equal(a.data(), a.data() + a.nbytes(), b.data());
}

class ExpertBlockThreads : public ::testing::Test {
 protected:
  void TearDown() override { set_num_threads(saved_); }
  int saved_ = num_threads();
};

TEST_F(ExpertBlockThreads, SameBitsForOneAndTwoThreads) {
  // Larger than the tiny problems, so that both threads get rows of every step.
  Problem p = make_problem({ExpertGateKind::GluPlusOne, ExpertActivation::SiLU, true, 0.5f}, false,
                           true, 5);
  p.tokens = 300;
  p.top_k = 2;
  std::mt19937 gen(9);
  std::uniform_real_distribution<double> u(-1, 1);
  p.x.resize(static_cast<size_t>(p.tokens * p.hidden));
  for (double& d : p.x) d = u(gen);
  p.routing.resize(static_cast<size_t>(p.tokens * p.top_k));
  for (double& d : p.routing) d = u(gen);
  p.ids.resize(static_cast<size_t>(p.tokens * p.top_k));
  for (size_t i = 0; i < p.ids.size(); ++i) p.ids[i] = static_cast<int64_t>((i * 7 + i / 5) % 4);
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Inputs in = inputs_of(p, dtype);
    const ExpertBlockWeights w = weights_of(in, false);
    const Tensor dy = in.hidden.clone();
    std::vector<Tensor> outs;
    std::vector<ExpertBlockGrads> grads;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      const ExpertBlockResult r =
          expert_block_forward(in.hidden, in.index, in.routing, w, p.gate, true);
      outs.push_back(r.out);
      grads.push_back(expert_block_backward(dy, in.hidden, in.routing, w, p.gate, r.saved));
    }
    EXPECT_TRUE(same_bits(outs[0], outs[1]));
    EXPECT_TRUE(same_bits(grads[0].hidden, grads[1].hidden));
    EXPECT_TRUE(same_bits(grads[0].top_k_weights, grads[1].top_k_weights));
    EXPECT_TRUE(same_bits(grads[0].first, grads[1].first));
    EXPECT_TRUE(same_bits(grads[0].down, grads[1].down));
    EXPECT_TRUE(same_bits(grads[0].first_bias, grads[1].first_bias));
  }
}

TEST(ExpertBlock, Fp8WeightsComputeAsTheirValues) {
  const ExpertGate g{ExpertGateKind::Multiply};
  Problem p = make_problem(g, false, false, 13);
  p.hidden = 130;  // two scale blocks along H
  std::mt19937 gen(2);
  std::uniform_real_distribution<double> u(-1, 1);
  for (auto* v : {&p.first, &p.x}) {
    v->resize(static_cast<size_t>(v == &p.x ? p.tokens * p.hidden
                                            : p.experts * p.first_out() * p.hidden));
    for (double& d : *v) d = u(gen);
  }
  p.down.resize(static_cast<size_t>(p.experts * p.hidden * p.width));
  for (double& d : p.down) d = u(gen);
  const Inputs in = inputs_of(p, DType::F32);
  // Codes and scales of each weight, and F32 weights holding exactly their values.
  auto quantized = [](const Tensor& values, Tensor& codes, Tensor& scales, Tensor& dequantized) {
    const int64_t e = values.dim(0), out = values.dim(1), cols = values.dim(2);
    codes = Tensor::zeros(values.shape(), DType::F8_E4M3);
    scales = Tensor::zeros({e, (out + 127) / 128, (cols + 127) / 128}, DType::F32);
    dequantized = Tensor::zeros(values.shape(), DType::F32);
    for (int64_t x = 0; x < e; ++x) {
      core::quantize_blocks(values.select(x), codes.select(x), scales.select(x));
      const float* s = scales.select(x).data_as<float>();
      const uint8_t* c = codes.select(x).data_as<uint8_t>();
      float* d = dequantized.select(x).mutable_data_as<float>();
      for (int64_t r = 0; r < out; ++r) {
        for (int64_t k = 0; k < cols; ++k) {
          d[r * cols + k] =
              f8e4m3_to_f32(c[r * cols + k]) * s[(r / 128) * ((cols + 127) / 128) + k / 128];
        }
      }
    }
  };
  Tensor fc, fs, fd, dc, ds, dd;
  quantized(in.first, fc, fs, fd);
  quantized(in.down, dc, ds, dd);
  const ExpertBlockWeights fp8{ExpertWeights::stacked(fc, fs), ExpertWeights::stacked(dc, ds)};
  const ExpertBlockWeights values_w{ExpertWeights::stacked(fd), ExpertWeights::stacked(dd)};
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    const Tensor x = in.hidden.to(act);
    const ExpertBlockResult a = expert_block_forward(x, in.index, in.routing, fp8, g, true);
    if (act == DType::F32) {
      const ExpertBlockResult b = expert_block_forward(x, in.index, in.routing, values_w, g, true);
      EXPECT_TRUE(same_bits(a.out, b.out));
      const ExpertBlockGrads ga =
          expert_block_backward(x, x, in.routing, fp8, g, a.saved, {.weights = false});
      const ExpertBlockGrads gb =
          expert_block_backward(x, x, in.routing, values_w, g, b.saved, {.weights = false});
      EXPECT_TRUE(same_bits(ga.hidden, gb.hidden));
      EXPECT_TRUE(same_bits(ga.top_k_weights, gb.top_k_weights));
    } else {
      expect_close(values(a.out),
                   values(expert_block_forward(in.hidden, in.index, in.routing, values_w, g).out),
                   4e-2, "bf16 activations");
    }
    EXPECT_EQ(error_of([&] { expert_block_backward(x, x, in.routing, fp8, g, a.saved); }).code(),
              ErrorCode::Fp8WeightsNotTrainable);
  }
}

TEST(ExpertBlock, IdsAsI32RouteAsI64) {
  const ExpertGate g{};
  const Problem p = make_problem(g, false, false, 17);
  const Inputs in = inputs_of(p, DType::F32);
  Tensor ids32 = Tensor::zeros(in.index.shape(), DType::I32);
  for (int64_t i = 0; i < ids32.numel(); ++i) {
    ids32.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(in.index.data_as<int64_t>()[i]);
  }
  const ExpertBlockWeights w = weights_of(in, false);
  EXPECT_TRUE(same_bits(expert_block_forward(in.hidden, ids32, in.routing, w, g).out,
                        expert_block_forward(in.hidden, in.index, in.routing, w, g).out));
}

TEST(ExpertBlock, BadArgumentsAreNamed) {
  const ExpertGate g{};
  const Problem p = make_problem(g, false, false, 19);
  Inputs in = inputs_of(p, DType::F32);
  const ExpertBlockWeights w = weights_of(in, false);
  auto forward = [&](const Tensor& index, const Tensor& routing, const ExpertBlockWeights& ww,
                     const ExpertGate& gg) {
    return error_of([&] { expert_block_forward(in.hidden, index, routing, ww, gg); });
  };
  Tensor negative = in.index.clone();
  negative.mutable_data_as<int64_t>()[3] = -1;
  Error e = forward(negative, in.routing, w, g);
  EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
  EXPECT_NE(std::string(e.what()).find("top_k_index[1, 1] is -1"), std::string::npos) << e.what();

  e = forward(in.index, Tensor::zeros({5, 3}, DType::F32), w, g);
  EXPECT_EQ(e.code(), ErrorCode::ShapeMismatch);
  EXPECT_NE(std::string(e.what()).find("top_k_weights has shape [5, 3], expected [5, 2]"),
            std::string::npos)
      << e.what();
  EXPECT_EQ(forward(Tensor::zeros({5, 2}, DType::F32), in.routing, w, g).code(),
            ErrorCode::DTypeMismatch);

  // A first projection of I rows is a block without gate, not a gated one.
  const ExpertBlockWeights odd{ExpertWeights::stacked(Tensor::zeros({3, 7, 8}, DType::F32)),
                               ExpertWeights::stacked(in.down)};
  e = forward(in.index, in.routing, odd, g);
  EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
  EXPECT_NE(std::string(e.what()).find("expert_block_forward: first: 7 output features"),
            std::string::npos)
      << e.what();
  e = forward(in.index, in.routing, w, {ExpertGateKind::None});
  EXPECT_EQ(e.code(), ErrorCode::ShapeMismatch);
  EXPECT_NE(
      std::string(e.what()).find("expert_block_forward: down: 3 experts of F32 [8 out, 6 in], "
                                 "expected 3 of F32 [8 out, 12 in]"),
      std::string::npos)
      << e.what();
  const ExpertBlockWeights mixed{ExpertWeights::stacked(in.first),
                                 ExpertWeights::stacked(in.down.to(DType::BF16))};
  EXPECT_EQ(forward(in.index, in.routing, mixed, g).code(), ErrorCode::ShapeMismatch);

  // Backward with what another forward saved.
  const ExpertBlockResult r = expert_block_forward(in.hidden, in.index, in.routing, w, g, true);
  ExpertBlockSaved other = r.saved;
  other.row_of_slot.pop_back();
  e = error_of([&] { expert_block_backward(in.hidden, in.hidden, in.routing, w, g, other); });
  EXPECT_EQ(e.code(), ErrorCode::BackwardBeforeForward);
  EXPECT_EQ(
      error_of([&] { expert_block_backward(in.hidden, in.hidden, in.routing, w, g, {}); }).code(),
      ErrorCode::BackwardBeforeForward);
  e = error_of(
      [&] { expert_block_backward(in.hidden.rows(0, 4), in.hidden, in.routing, w, g, r.saved); });
  EXPECT_EQ(e.code(), ErrorCode::ShapeMismatch);
  EXPECT_NE(std::string(e.what()).find("d_out"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace grouplin
