// Helpers shared by the load_state_dict tests: small GroupedLinear options, a nested model tree,
// deterministic inputs, snapshots of a module tree, and a forward/backward run whose results
// can be compared bit for bit between modules.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/grouped_linear.hpp"
#include "grouplin/load_state_dict.hpp"
#include "grouplin/module.hpp"
#include "grouplin/state_dict.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin {
// Found by GoogleTest through ADL: parameterised test names print "single", not raw bytes.
inline void PrintTo(WeightLayout l, std::ostream* os) { *os << layout_name(l); }
}  // namespace grouplin

namespace grouplin::testing {

// Values uniform in [-1, 1), rounded to `dtype` by the library.
inline Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& f : v) f = dist(gen);
  return Tensor::from_f32(shape, v, dtype);
}

inline constexpr WeightLayout kLayouts[] = {WeightLayout::PerExpert, WeightLayout::Contiguous,
                                            WeightLayout::Single};

inline GroupedLinearOptions gl_options(int64_t n, WeightLayout layout, uint64_t seed,
                                       bool bias = true, DType dtype = DType::F32, int64_t in = 5,
                                       int64_t out = 3) {
  GroupedLinearOptions o;
  o.num_gemms = n;
  o.in_features = in;
  o.out_features = out;
  o.bias = bias;
  o.params_dtype = dtype;
  o.weight_layout = layout;
  o.seed = seed;
  return o;
}

inline std::shared_ptr<GroupedLinear> make_gl(const GroupedLinearOptions& o) {
  return std::make_shared<GroupedLinear>(o);
}

// A model tree root -> decoder -> layers -> {0, 1, 2, 3} -> mlp -> {fc1, fc2}; fc1 and fc2 sit
// only under layers.3 (layers 0..2 are empty), so fc1's keys start with kFc1Prefix.
inline constexpr const char* kFc1Prefix = "decoder.layers.3.mlp.fc1.";
inline constexpr const char* kFc1Name = "decoder.layers.3.mlp.fc1";

struct Tree {
  std::shared_ptr<Sequential> root;
  std::shared_ptr<Sequential> layers;  // "decoder.layers"
  std::shared_ptr<GroupedLinear> fc1, fc2;
};

inline Tree make_tree(std::shared_ptr<GroupedLinear> fc1, std::shared_ptr<GroupedLinear> fc2) {
  Tree t{std::make_shared<Sequential>(), std::make_shared<Sequential>(), fc1, fc2};
  auto decoder = std::make_shared<Sequential>();
  auto mlp = std::make_shared<Sequential>();
  mlp->add_child("fc1", fc1);
  mlp->add_child("fc2", fc2);
  for (int i = 0; i < 3; ++i)
    t.layers->add_child(std::to_string(i), std::make_shared<Sequential>());
  auto layer3 = std::make_shared<Sequential>();
  layer3->add_child("mlp", mlp);
  t.layers->add_child("3", layer3);
  decoder->add_child("layers", t.layers);
  t.root->add_child("decoder", decoder);
  return t;
}

// Deterministic values in [-1, 1), different for each (shape, seed).
inline Tensor test_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::F32) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (float& f : v) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    f = static_cast<float>(static_cast<int64_t>(x >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  return Tensor::from_f32(shape, v, dtype);
}

// A copy of every entry of a state dict (deep: clones the bytes), in order.
using Snapshot = std::vector<std::pair<std::string, Tensor>>;
inline Snapshot snapshot(const StateDict& sd) {
  Snapshot s;
  for (const auto& [k, t] : sd) s.emplace_back(k, t.clone());
  return s;
}
inline Snapshot snapshot(const Module& m) { return snapshot(m.state_dict()); }

// Every parameter and buffer of `m` (or every entry of a dict) still holds the snapshot's bits.
inline void expect_same(const Snapshot& before, const StateDict& now) {
  ASSERT_EQ(now.size(), before.size());
  size_t i = 0;
  for (const auto& [k, t] : now) {
    EXPECT_EQ(k, before[i].first);
    EXPECT_TRUE(t.bit_equal(before[i].second)) << "entry \"" << k << "\" changed";
    ++i;
  }
}
inline void expect_unchanged(const Module& m, const Snapshot& before) {
  expect_same(before, m.state_dict());
}

// Results of one forward and backward pass over fixed inputs.
struct Pass {
  Tensor y, dx;
  std::vector<Tensor> wgrad, bgrad;  // per expert, cloned
};

// m_splits with some empty experts, summing to about 2 rows per expert.
inline std::vector<int64_t> test_splits(int64_t n) {
  std::vector<int64_t> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) s[static_cast<size_t>(i)] = (i * 7 + 3) % 4;  // 3, 2, 1, 0, ...
  return s;
}

inline Pass run_pass(GroupedLinear& gl) {
  const auto& o = gl.options();
  const std::vector<int64_t> splits = test_splits(o.num_gemms);
  int64_t rows = 0;
  for (int64_t m : splits) rows += m;
  Pass p;
  p.y = gl.forward(test_tensor({rows, o.in_features}, 11, o.params_dtype), splits);
  p.dx = gl.backward(test_tensor({rows, o.out_features}, 12, o.params_dtype));
  for (int64_t i = 0; i < o.num_gemms; ++i) {
    p.wgrad.push_back(gl.expert_weight_grad(i).clone());
    if (o.bias) p.bgrad.push_back(gl.expert_bias_grad(i).clone());
  }
  return p;
}

inline void expect_same_pass(const Pass& a, const Pass& b) {
  EXPECT_TRUE(a.y.bit_equal(b.y)) << "forward output differs";
  EXPECT_TRUE(a.dx.bit_equal(b.dx)) << "dgrad differs";
  ASSERT_EQ(a.wgrad.size(), b.wgrad.size());
  ASSERT_EQ(a.bgrad.size(), b.bgrad.size());
  for (size_t i = 0; i < a.wgrad.size(); ++i) {
    EXPECT_TRUE(a.wgrad[i].bit_equal(b.wgrad[i])) << "weight grad of expert " << i;
  }
  for (size_t i = 0; i < a.bgrad.size(); ++i) {
    EXPECT_TRUE(a.bgrad[i].bit_equal(b.bgrad[i])) << "bias grad of expert " << i;
  }
}

// Expert weights and biases of two modules hold the same bits (after converting b's dtype).
inline void expect_same_experts(const GroupedLinear& a, const GroupedLinear& b) {
  ASSERT_EQ(a.num_gemms(), b.num_gemms());
  for (int64_t i = 0; i < a.num_gemms(); ++i) {
    EXPECT_TRUE(a.expert_weight(i).bit_equal(b.expert_weight(i).to(a.options().params_dtype)))
        << "weight of expert " << i;
    if (a.options().bias) {
      EXPECT_TRUE(a.expert_bias(i).bit_equal(b.expert_bias(i).to(a.options().params_dtype)))
          << "bias of expert " << i;
    }
  }
}

// A dict holding `sd`'s entries under another prefix: "fc1.weight" with from="fc1.", to="" is
// "weight". Entries not starting with `from` are dropped.
inline StateDict reprefix(const StateDict& sd, const std::string& from, const std::string& to) {
  StateDict out;
  for (const auto& [k, t] : sd) {
    if (k.compare(0, from.size(), from) == 0) out.insert(to + k.substr(from.size()), t);
  }
  return out;
}

// Runs `fn`, which must throw grouplin::Error; returns it.
template <class Fn>
Error expect_error(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a grouplin::Error";
  return Error(ErrorCode::InvalidArgument, "<no error thrown>");
}

}  // namespace grouplin::testing
