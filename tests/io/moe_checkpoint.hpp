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

// A Hugging Face MoE checkpoint of `layers` layers of `experts` experts (hidden size `hidden`,
// expert size `inter`), with the attention, router and norm entries around the experts:
//   family "qwen"     model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight, router
//                     model.layers.L.mlp.gate.weight
//   family "mixtral"  model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight, router
//                     model.layers.L.block_sparse_moe.gate.weight
// in the per-expert form, or, `fused`, as transformers v5 holds it: model.layers.L.mlp.experts.
// gate_up_proj [N, 2I, H] (each expert's gate rows, then its up rows) and down_proj [N, H, I],
// every ".block_sparse_moe." renamed ".mlp.". Values do not depend on the form. `scales` adds
// FP8-style weight_scale_inv entries ([ceil(out/128), ceil(in/128)], F32) beside each weight; the
// fused form concatenates the gate's and the up's, which is exact when `inter` is a multiple of
// 128.
struct HfSpec {
  std::string family = "qwen";
  int64_t layers = 2, experts = 4, hidden = 6, inter = 4;
  DType dtype = DType::BF16;
  bool scales = false;
};

inline StateDict hf_state_dict(const HfSpec& s, bool fused) {
  const bool mixtral = s.family == "mixtral";
  const std::string moe = mixtral && !fused ? "block_sparse_moe" : "mlp";
  const std::string gate = mixtral ? "w1" : "gate_proj", up = mixtral ? "w3" : "up_proj",
                    down = mixtral ? "w2" : "down_proj";
  auto blocks = [](int64_t n) { return (n + 127) / 128; };
  StateDict sd;
  uint32_t seed = 1;
  sd.insert("model.embed_tokens.weight", pattern_tensor({10, s.hidden}, s.dtype, seed++));
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string layer = "model.layers." + std::to_string(l) + ".";
    sd.insert(layer + "self_attn.q_proj.weight",
              pattern_tensor({s.hidden, s.hidden}, s.dtype, seed++));
    sd.insert(layer + moe + ".gate.weight", pattern_tensor({s.experts, s.hidden}, s.dtype, seed++));
    std::vector<Tensor> g, u, d, gs, us, ds;
    for (int64_t e = 0; e < s.experts; ++e) {
      g.push_back(pattern_tensor({s.inter, s.hidden}, s.dtype, seed++));
      u.push_back(pattern_tensor({s.inter, s.hidden}, s.dtype, seed++));
      d.push_back(pattern_tensor({s.hidden, s.inter}, s.dtype, seed++));
      gs.push_back(pattern_tensor({blocks(s.inter), blocks(s.hidden)}, DType::F32, seed++));
      us.push_back(pattern_tensor({blocks(s.inter), blocks(s.hidden)}, DType::F32, seed++));
      ds.push_back(pattern_tensor({blocks(s.hidden), blocks(s.inter)}, DType::F32, seed++));
    }
    const std::string experts = layer + moe + ".experts.";
    if (fused) {
      std::vector<Tensor> gate_up, gate_up_scales;
      for (int64_t e = 0; e < s.experts; ++e) {
        gate_up.push_back(stack({g[e], u[e]}).reshape({2 * s.inter, s.hidden}));
        gate_up_scales.push_back(
            stack({gs[e], us[e]}).reshape({2 * blocks(s.inter), blocks(s.hidden)}));
      }
      sd.insert(experts + "gate_up_proj", stack(gate_up));
      if (s.scales) sd.insert(experts + "gate_up_proj_scale_inv", stack(gate_up_scales));
      sd.insert(experts + "down_proj", stack(d));
      if (s.scales) sd.insert(experts + "down_proj_scale_inv", stack(ds));
    } else {
      for (int64_t e = 0; e < s.experts; ++e) {
        const std::string p = experts + std::to_string(e) + ".";
        sd.insert(p + gate + ".weight", g[e]);
        if (s.scales) sd.insert(p + gate + ".weight_scale_inv", gs[e]);
        sd.insert(p + up + ".weight", u[e]);
        if (s.scales) sd.insert(p + up + ".weight_scale_inv", us[e]);
        sd.insert(p + down + ".weight", d[e]);
        if (s.scales) sd.insert(p + down + ".weight_scale_inv", ds[e]);
      }
    }
    sd.insert(layer + "post_attention_layernorm.weight",
              pattern_tensor({s.hidden}, s.dtype, seed++));
  }
  sd.insert("lm_head.weight", pattern_tensor({10, s.hidden}, s.dtype, seed++));
  return sd;
}

}  // namespace grouplin::testing
