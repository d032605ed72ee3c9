#include "grouplin/grouped_linear.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "grouplin/error.hpp"
#include "kernels/grouped_gemm.hpp"
#include "nn/init.hpp"

namespace grouplin {

std::string_view layout_name(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::PerExpert:
      return "per-expert";
    case WeightLayout::Contiguous:
      return "contiguous";
    case WeightLayout::Single:
      return "single";
  }
  return "unknown";
}

WeightLayout resolve_weight_layout(std::optional<WeightLayout> requested) {
  if (requested) return *requested;
  const char* raw = std::getenv(kContiguousWeightsEnv);
  if (raw == nullptr) return WeightLayout::PerExpert;
  std::string v(raw);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "1" || v == "true" || v == "yes" || v == "on") return WeightLayout::Contiguous;
  if (v.empty() || v == "0" || v == "false" || v == "no" || v == "off")
    return WeightLayout::PerExpert;
  throw Error(ErrorCode::InvalidEnvironment,
              std::string("environment variable ") + kContiguousWeightsEnv + "=\"" + raw +
                  "\": expected one of 1 true yes on / 0 false no off / empty (any case)");
}

namespace {

void check_options(const GroupedLinearOptions& o) {
  auto require_positive = [](const char* name, int64_t v) {
    if (v < 1) {
      throw Error(ErrorCode::InvalidArgument, std::string("GroupedLinear: ") + name + " is " +
                                                  std::to_string(v) + ", expected >= 1");
    }
  };
  require_positive("num_gemms", o.num_gemms);
  require_positive("in_features", o.in_features);
  require_positive("out_features", o.out_features);
  if (o.params_dtype != DType::F32 && o.params_dtype != DType::BF16) {
    throw Error(ErrorCode::UnsupportedDType, "GroupedLinear: params_dtype is " +
                                                 std::string(dtype_name(o.params_dtype)) +
                                                 ", expected F32 or BF16");
  }
}

}  // namespace

GroupedLinear::GroupedLinear(const GroupedLinearOptions& options)
    : options_(options), layout_(resolve_weight_layout(options.weight_layout)) {
  check_options(options_);
  const int64_t n = options_.num_gemms, in = options_.in_features, out = options_.out_features;
  const DType dt = options_.params_dtype;
  const Shape w_shape = {out, in}, b_shape = {out};
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));

  switch (layout_) {
    case WeightLayout::Single: {
      Tensor w = Tensor::zeros({n, out, in}, dt);
      for (int64_t i = 0; i < n; ++i) init_uniform(w.select(i), options_.seed, 2 * i, bound);
      register_parameter("weight", w);
      if (options_.bias) {
        Tensor b = Tensor::zeros({n, out}, dt);
        for (int64_t i = 0; i < n; ++i) init_uniform(b.select(i), options_.seed, 2 * i + 1, bound);
        register_parameter("bias", b);
      }
      break;
    }
    case WeightLayout::Contiguous:
    case WeightLayout::PerExpert: {
      const bool grouped = layout_ == WeightLayout::Contiguous;
      if (grouped) weight_group_ = GroupedTensor::make_uniform(n, w_shape, dt);
      for (int64_t i = 0; i < n; ++i) {
        Tensor w = grouped ? weight_group_.member(i) : Tensor::zeros(w_shape, dt);
        init_uniform(w, options_.seed, 2 * i, bound);
        register_parameter("weight" + std::to_string(i), w);
      }
      if (options_.bias) {
        if (grouped) bias_group_ = GroupedTensor::make_uniform(n, b_shape, dt);
        for (int64_t i = 0; i < n; ++i) {
          Tensor b = grouped ? bias_group_.member(i) : Tensor::zeros(b_shape, dt);
          init_uniform(b, options_.seed, 2 * i + 1, bound);
          register_parameter("bias" + std::to_string(i), b);
        }
      }
      break;
    }
  }
  // Quantisation state would live here; GroupLin has none yet, so it is always empty.
  register_buffer("_extra_state", Tensor::zeros({0}, DType::U8));
}

const Parameter& GroupedLinear::weight_param(int64_t i) const {
  return layout_ == WeightLayout::Single ? parameters()[0] : parameters()[static_cast<size_t>(i)];
}

const Parameter* GroupedLinear::bias_param(int64_t i) const {
  if (!options_.bias) return nullptr;
  if (layout_ == WeightLayout::Single) return &parameters()[1];
  return &parameters()[static_cast<size_t>(options_.num_gemms + i)];
}

Tensor GroupedLinear::expert_view(const Tensor& t, int64_t i) const {
  if (!t.defined()) return t;
  return layout_ == WeightLayout::Single ? t.select(i) : t;
}

namespace {
void check_expert_index(int64_t i, int64_t n) {
  if (i < 0 || i >= n) {
    throw Error(ErrorCode::OutOfBounds,
                "expert index " + std::to_string(i) + ", expected 0.." + std::to_string(n - 1));
  }
}
}  // namespace

Tensor GroupedLinear::expert_weight(int64_t i) const {
  check_expert_index(i, num_gemms());
  return expert_view(weight_param(i).value, i);
}
Tensor GroupedLinear::expert_bias(int64_t i) const {
  check_expert_index(i, num_gemms());
  const Parameter* p = bias_param(i);
  return p ? expert_view(p->value, i) : Tensor();
}
Tensor GroupedLinear::expert_weight_grad(int64_t i) const {
  check_expert_index(i, num_gemms());
  return expert_view(weight_param(i).grad, i);
}
Tensor GroupedLinear::expert_bias_grad(int64_t i) const {
  check_expert_index(i, num_gemms());
  const Parameter* p = bias_param(i);
  return p ? expert_view(p->grad, i) : Tensor();
}
Tensor GroupedLinear::expert_main_grad(int64_t i) const {
  check_expert_index(i, num_gemms());
  return expert_view(weight_param(i).main_grad, i);
}

void GroupedLinear::check_forward_args(const Tensor& x, std::span<const int64_t> m_splits) const {
  const int64_t n = num_gemms();
  if (static_cast<int64_t>(m_splits.size()) != n) {
    throw Error(ErrorCode::SplitCountMismatch,
                "GroupedLinear.forward: m_splits has " + std::to_string(m_splits.size()) +
                    " entries, expected num_gemms = " + std::to_string(n));
  }
  if (!x.defined())
    throw Error(ErrorCode::UndefinedTensor, "GroupedLinear.forward: x is undefined");
  if (x.rank() != 2 || x.dim(1) != options_.in_features) {
    throw Error(ErrorCode::ShapeMismatch, "GroupedLinear.forward: x has shape " +
                                              shape_to_string(x.shape()) + ", expected [T, " +
                                              std::to_string(options_.in_features) + "]");
  }
  if (x.dtype() != options_.params_dtype) {
    throw Error(ErrorCode::DTypeMismatch, "GroupedLinear.forward: x is " +
                                              std::string(dtype_name(x.dtype())) + ", expected " +
                                              std::string(dtype_name(options_.params_dtype)));
  }
  // Every entry is checked for sign before any is summed, so a negative entry is reported as
  // such even after one that already overshoots T.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t m = m_splits[static_cast<size_t>(i)];
    if (m < 0) {
      throw Error(ErrorCode::NegativeSplit, "GroupedLinear.forward: m_splits[" + std::to_string(i) +
                                                "] is " + std::to_string(m) + ", expected >= 0");
    }
  }
  int64_t sum = 0;
  bool overflow = false;
  for (int64_t m : m_splits) overflow |= __builtin_add_overflow(sum, m, &sum);
  if (overflow || sum != x.dim(0)) {
    throw Error(ErrorCode::SplitSumMismatch,
                "GroupedLinear.forward: m_splits sum to " +
                    (overflow ? std::string("more than 2^63") : std::to_string(sum)) +
                    ", expected T = " + std::to_string(x.dim(0)) + " (rows of x)");
  }
}

Tensor GroupedLinear::forward(const Tensor& x, std::span<const int64_t> m_splits) {
  check_forward_args(x, m_splits);
  const int64_t n = num_gemms();
  std::vector<Tensor> weights, biases;
  for (int64_t i = 0; i < n; ++i) {
    weights.push_back(expert_weight(i));
    if (options_.bias) biases.push_back(expert_bias(i));
  }
  Tensor y = Tensor::zeros({x.dim(0), options_.out_features}, options_.params_dtype);
  kernels::grouped_forward(x, m_splits, weights, biases, y);
  saved_x_ = x;
  saved_splits_.assign(m_splits.begin(), m_splits.end());
  has_saved_ = true;
  return y;
}

void GroupedLinear::allocate_grads() {
  // Gradients mirror the layout of the parameters: one [N, ...] tensor for Single, one group
  // for Contiguous, separate tensors for PerExpert.
  const int64_t n = num_gemms(), in = options_.in_features, out = options_.out_features;
  const DType dt = options_.params_dtype;
  if (layout_ == WeightLayout::Contiguous) {
    if (options_.fuse_wgrad_accumulation) {
      main_grad_group_ = GroupedTensor::make_uniform(n, {out, in}, DType::F32);
    } else {
      weight_grad_group_ = GroupedTensor::make_uniform(n, {out, in}, dt);
    }
    if (options_.bias) bias_grad_group_ = GroupedTensor::make_uniform(n, {out}, dt);
  }
  for (size_t k = 0; k < parameters().size(); ++k) {
    Parameter& p = parameter_at(k);
    const bool is_weight = p.name.rfind("weight", 0) == 0;
    const bool fused = is_weight && options_.fuse_wgrad_accumulation;
    const auto k64 = static_cast<int64_t>(k);
    const int64_t i = is_weight ? k64 : k64 - n;  // expert index (unused for Single)
    if (layout_ == WeightLayout::Contiguous) {
      if (fused) {
        p.main_grad = main_grad_group_.member(i);
      } else {
        p.grad = (is_weight ? weight_grad_group_ : bias_grad_group_).member(i);
      }
    } else if (fused) {
      p.main_grad = Tensor::zeros(p.value.shape(), DType::F32);
    } else {
      p.grad = Tensor::zeros(p.value.shape(), dt);
    }
  }
}

Tensor GroupedLinear::backward(const Tensor& dy) {
  if (!has_saved_) {
    throw Error(ErrorCode::BackwardBeforeForward,
                "GroupedLinear.backward: called before forward (no saved input)");
  }
  const int64_t t = saved_x_.dim(0);
  if (!dy.defined() || dy.rank() != 2 || dy.dim(0) != t || dy.dim(1) != options_.out_features) {
    throw Error(ErrorCode::ShapeMismatch,
                "GroupedLinear.backward: dy has shape " +
                    (dy.defined() ? shape_to_string(dy.shape()) : std::string("<undefined>")) +
                    ", expected [" + std::to_string(t) + ", " +
                    std::to_string(options_.out_features) + "]");
  }
  if (dy.dtype() != options_.params_dtype) {
    throw Error(ErrorCode::DTypeMismatch, "GroupedLinear.backward: dy is " +
                                              std::string(dtype_name(dy.dtype())) + ", expected " +
                                              std::string(dtype_name(options_.params_dtype)));
  }
  if (!grads_allocated_) {
    allocate_grads();
    grads_allocated_ = true;
  }

  const int64_t n = num_gemms();
  std::vector<Tensor> weights, wgrads, bgrads;
  for (int64_t i = 0; i < n; ++i) {
    weights.push_back(expert_weight(i));
    wgrads.push_back(options_.fuse_wgrad_accumulation ? expert_main_grad(i)
                                                      : expert_weight_grad(i));
    if (options_.bias) bgrads.push_back(expert_bias_grad(i));
  }
  Tensor dx = Tensor::zeros({t, options_.in_features}, options_.params_dtype);
  kernels::grouped_dgrad(dy, saved_splits_, weights, dx);
  kernels::grouped_wgrad(saved_x_, dy, saved_splits_, wgrads, options_.fuse_wgrad_accumulation);
  if (options_.bias) kernels::grouped_bgrad(dy, saved_splits_, bgrads);
  return dx;
}

}  // namespace grouplin
