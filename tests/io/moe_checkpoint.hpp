// Test helper: state dicts of a small synthetic MoE model in either expert layout, with the
// same values in both, plus ordinary entries that a conversion must pass through unchanged.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/state_dict.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin::testing {

struct MoeModuleSpec {
  std::string prefix;  // "model.layers.3.mlp.experts." or "" (root)
  int64_t experts = 4;
  int64_t out = 3;
  int64_t in = 5;
  bool bias = true;
  DType dtype = DType::F32;
};

// A deterministic tensor whose values depend on `seed` (float dtypes; integers get the bytes).
inline Tensor pattern_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  const auto n = static_cast<size_t>(shape_numel(shape));
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] =
        static_cast<float>(
            static_cast<int>((seed * 7919u + static_cast<uint32_t>(i) * 104729u) % 2001u) - 1000) /
        256.0f;
  }
  if (is_float(dtype)) return Tensor::from_f32(shape, v, dtype);
  Tensor t = Tensor::zeros(shape, dtype);
  std::byte* p = t.mutable_data();
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<std::byte>((seed + i * 31) & 0xFF);
  return t;
}

// N tensors of one shape stacked into a new [N, ...] tensor.
inline Tensor stack(const std::vector<Tensor>& parts) {
  Shape shape = parts.front().shape();
  shape.insert(shape.begin(), static_cast<int64_t>(parts.size()));
  Tensor out = Tensor::zeros(shape, parts.front().dtype());
  std::byte* p = out.mutable_data();
  for (const Tensor& t : parts) {
    if (t.nbytes()) std::memcpy(p, t.data(), t.nbytes());
    p += t.nbytes();
  }
  return out;
}

// The state dict of `modules` in `layout`: "model.embed.weight", then for each module its weights,
// biases and "_extra_state", then a convolution ("model.conv.weight" [4, 2, 3] and its bias [4]),
// "model.norm.weight" (BF16) and "step" (I64, rank 0). Expert values do not depend on the layout.
inline StateDict moe_state_dict(const std::vector<MoeModuleSpec>& modules, ExpertLayout layout,
                                bool extras = true) {
  StateDict sd;
  if (extras) sd.insert("model.embed.weight", pattern_tensor({6, 4}, DType::F32, 1));
  uint32_t seed = 100;
  for (const MoeModuleSpec& m : modules) {
    std::vector<Tensor> w, b;
    for (int64_t i = 0; i < m.experts; ++i) {
      w.push_back(pattern_tensor({m.out, m.in}, m.dtype, seed++));
      b.push_back(pattern_tensor({m.out}, m.dtype, seed++));
    }
    if (layout == ExpertLayout::Single) {
      sd.insert(m.prefix + "weight", stack(w));
      if (m.bias) sd.insert(m.prefix + "bias", stack(b));
    } else {
      for (int64_t i = 0; i < m.experts; ++i)
        sd.insert(m.prefix + "weight" + std::to_string(i), w[i]);
      for (int64_t i = 0; m.bias && i < m.experts; ++i) {
        sd.insert(m.prefix + "bias" + std::to_string(i), b[i]);
      }
    }
    if (extras) sd.insert(m.prefix + "_extra_state", Tensor::zeros({0}, DType::U8));
  }
  if (extras) {
    sd.insert("model.conv.weight", pattern_tensor({4, 2, 3}, DType::F32, 2));
    sd.insert("model.conv.bias", pattern_tensor({4}, DType::F32, 3));
    sd.insert("model.norm.weight", pattern_tensor({4}, DType::BF16, 4));
    sd.insert("step", pattern_tensor({}, DType::I64, 5));
  }
  return sd;
}

}  // namespace grouplin::testing
