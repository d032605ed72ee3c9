#include "grouplin/grouped_linear.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/fp8.hpp"
#include "grouplin/error.hpp"
#include "kernels/grouped_gemm.hpp"
#include "nn/grouped_args.hpp"
#include "nn/init.hpp"
#include "nn/packed_weight_cache.hpp"

namespace grouplin {

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
              std::string("environment variable ") + kContiguousWeightsEnv + "=" + quote(raw) +
                  ": expected one of 1 true yes on / 0 false no off / empty (any case)");
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
  if (o.first_expert < 0) {
    throw Error(ErrorCode::InvalidArgument, "GroupedLinear: first_expert is " +
                                                std::to_string(o.first_expert) + ", expected >= 0");
  }
  const DType p = o.params_dtype;
  if (p != DType::F32 && p != DType::BF16 && p != DType::F8_E4M3) {
    throw Error(ErrorCode::UnsupportedDType, "GroupedLinear: params_dtype is " +
                                                 std::string(dtype_name(p)) +
                                                 ", expected F32, BF16 or F8_E4M3");
  }
  if (const std::optional<DType> a = o.activation_dtype) {
    const bool ok = p == DType::F8_E4M3 ? (*a == DType::F32 || *a == DType::BF16) : *a == p;
    if (!ok) {
      throw Error(ErrorCode::UnsupportedDType,
                  "GroupedLinear: activation_dtype is " + std::string(dtype_name(*a)) +
                      ", expected " +
                      (p == DType::F8_E4M3 ? std::string("F32 or BF16 beside F8_E4M3 weights")
                                           : std::string(dtype_name(p)) + " (params_dtype)"));
    }
  }
  if (p == DType::F8_E4M3 && o.fuse_wgrad_accumulation) {
    throw Error(ErrorCode::Fp8WeightsNotTrainable,
                "GroupedLinear: fuse_wgrad_accumulation with F8_E4M3 weights: FP8 weights are "
                "for inference and have no gradient");
  }
}

DType activations_of(const GroupedLinearOptions& o) {
  if (o.activation_dtype) return *o.activation_dtype;
  return o.params_dtype == DType::F8_E4M3 ? DType::BF16 : o.params_dtype;
}

using core::kFp8Block;  // the block of the FP8 weights' scales, as the kernels read them

Shape fp8_scale_shape(int64_t out, int64_t in) {
  return core::block_scale_shape(out, in, {kFp8Block, kFp8Block});
}

}  // namespace

namespace {

// One family of per-expert tensors in `layout`: `experts` are views of `stacked` (Single, one
// [N, ...] tensor), of `group` (Contiguous, one allocation) or separate tensors (PerExpert).
struct FamilyStorage {
  std::vector<Tensor> experts;
  Tensor stacked;
};
FamilyStorage family_storage(int64_t n, const Shape& shape, DType dt, WeightLayout layout,
                             GroupedTensor& group) {
  FamilyStorage f;
  if (layout == WeightLayout::Single) {
    Shape stacked = shape;
    stacked.insert(stacked.begin(), n);
    f.stacked = Tensor::zeros(stacked, dt);
  } else if (layout == WeightLayout::Contiguous) {
    group = GroupedTensor::make_uniform(n, shape, dt);
  }
  for (int64_t i = 0; i < n; ++i) {
    f.experts.push_back(layout == WeightLayout::Single       ? f.stacked.select(i)
                        : layout == WeightLayout::Contiguous ? group.member(i)
                                                             : Tensor::zeros(shape, dt));
  }
  return f;
}

}  // namespace

GroupedLinear::GroupedLinear(const GroupedLinearOptions& options)
    : options_(options),
      layout_(resolve_weight_layout(options.weight_layout)),
      bias_layout_(options.bias_layout.value_or(layout_)),
      activations_(activations_of(options)) {
  check_options(options_);
  const int64_t n = options_.num_gemms, in = options_.in_features, out = options_.out_features;
  const bool fp8 = options_.params_dtype == DType::F8_E4M3;
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));

  // FP8 scales, in the weights' layout: the weights' initialisation writes them.
  const FamilyStorage scales =
      fp8 ? family_storage(n, fp8_scale_shape(out, in), DType::F32, layout_, scale_group_)
          : FamilyStorage{};
  // Expert i's values: the F32 or BF16 draws, or for FP8 the F32 draws quantized.
  auto init_expert = [&](Tensor t, int64_t i, int64_t stream) {
    const int64_t global = options_.first_expert + i;
    if (t.dtype() != DType::F8_E4M3) {
      return init_uniform(t, options_.seed, 2 * global + stream, bound);
    }
    Tensor values = Tensor::zeros(t.shape(), DType::F32);
    init_uniform(values, options_.seed, 2 * global + stream, bound);
    core::quantize_blocks(values, t, scales.experts[static_cast<size_t>(i)]);
  };

  // The weights, then the biases, each family in its own layout. Expert i draws stream 2g for its
  // weight and 2g + 1 for its bias (g = first_expert + i), so every layout holds the same bits.
  auto add_family = [&](const char* base, const Shape& shape, DType dt, WeightLayout layout,
                        GroupedTensor& group, int64_t stream) {
    const FamilyStorage f = family_storage(n, shape, dt, layout, group);
    for (int64_t i = 0; i < n; ++i) init_expert(f.experts[static_cast<size_t>(i)], i, stream);
    if (layout == WeightLayout::Single) {
      register_parameter(base, f.stacked);
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      register_parameter(base + std::to_string(i), f.experts[static_cast<size_t>(i)]);
    }
  };
  add_family("weight", {out, in}, options_.params_dtype, layout_, weight_group_, 0);
  if (options_.bias) add_family("bias", {out}, activations_, bias_layout_, bias_group_, 1);
  // Quantisation state of TransformerEngine's own recipes would live here; GroupLin has none, so
  // it is always empty. Optional: Hugging Face, vLLM and most non-TE checkpoints have none.
  register_buffer("_extra_state", Tensor::zeros({0}, DType::U8), /*optional=*/true);
  // FP8 scales are the buffers after it (scale_buffer), named as TransformerEngine's FP8
  // checkpoints and the te rules name them.
  if (fp8 && layout_ == WeightLayout::Single) register_buffer("weight_scale_inv", scales.stacked);
  for (int64_t i = 0; fp8 && layout_ != WeightLayout::Single && i < n; ++i) {
    register_buffer("weight" + std::to_string(i) + "_scale_inv",
                    scales.experts[static_cast<size_t>(i)]);
  }
}

const Parameter& GroupedLinear::weight_param(int64_t i) const {
  return layout_ == WeightLayout::Single ? parameters()[0] : parameters()[static_cast<size_t>(i)];
}

size_t GroupedLinear::first_bias_param() const {
  return layout_ == WeightLayout::Single ? 1 : static_cast<size_t>(options_.num_gemms);
}

const Parameter* GroupedLinear::bias_param(int64_t i) const {
  if (!options_.bias) return nullptr;
  if (bias_layout_ == WeightLayout::Single) return &parameters()[first_bias_param()];
  return &parameters()[first_bias_param() + static_cast<size_t>(i)];
}

Tensor GroupedLinear::expert_view(const Tensor& t, int64_t i, WeightLayout layout) {
  if (!t.defined()) return t;
  return layout == WeightLayout::Single ? t.select(i) : t;
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
  return expert_view(weight_param(i).value, i, layout_);
}
Tensor GroupedLinear::expert_bias(int64_t i) const {
  check_expert_index(i, num_gemms());
  const Parameter* p = bias_param(i);
  return p ? expert_view(p->value, i, bias_layout_) : Tensor();
}
size_t GroupedLinear::scale_buffer(int64_t i) const {
  return layout_ == WeightLayout::Single ? 1 : 1 + static_cast<size_t>(i);
}

Tensor GroupedLinear::expert_weight_scale(int64_t i) const {
  check_expert_index(i, num_gemms());
  if (options_.params_dtype != DType::F8_E4M3) return Tensor();
  return expert_view(buffers()[scale_buffer(i)].second, i, layout_);
}

namespace {
void refuse_fp8_grad(const GroupedLinearOptions& o, const char* what) {
  if (o.params_dtype == DType::F8_E4M3) {
    throw Error(ErrorCode::Fp8WeightsNotTrainable,
                std::string("GroupedLinear.") + what +
                    ": the weights are F8_E4M3 codes (inference): they have no gradient; "
                    "backward gives dx and the bias gradients");
  }
}
}  // namespace

Tensor GroupedLinear::expert_weight_grad(int64_t i) const {
  check_expert_index(i, num_gemms());
  refuse_fp8_grad(options_, "expert_weight_grad");
  return expert_view(weight_param(i).grad, i, layout_);
}
Tensor GroupedLinear::expert_bias_grad(int64_t i) const {
  check_expert_index(i, num_gemms());
  const Parameter* p = bias_param(i);
  return p ? expert_view(p->grad, i, bias_layout_) : Tensor();
}
Tensor GroupedLinear::expert_main_grad(int64_t i) const {
  check_expert_index(i, num_gemms());
  refuse_fp8_grad(options_, "expert_main_grad");
  return expert_view(weight_param(i).main_grad, i, layout_);
}

void GroupedLinear::check_forward_args(const Tensor& x, std::span<const int64_t> m_splits) const {
  const char* op = "GroupedLinear.forward";
  if (static_cast<int64_t>(m_splits.size()) != num_gemms()) {  // first: the layer's own count
    detail::check_splits(op, m_splits, num_gemms(), 0);
  }
  detail::check_rows(op, "x", x, -1, options_.in_features, activations_);
  detail::check_splits(op, m_splits, num_gemms(), x.dim(0));
}

namespace {

// Checks a caller-provided output of `op` ("forward: y") against its expected shape and dtype.
void check_output(const Tensor& out, const Shape& shape, DType dtype, const std::string& what,
                  std::initializer_list<const Tensor*> inputs) {
  if (!out.defined() || out.shape() != shape) {
    throw Error(ErrorCode::ShapeMismatch,
                "GroupedLinear." + what + " has shape " +
                    (out.defined() ? shape_to_string(out.shape()) : std::string("<undefined>")) +
                    ", expected " + shape_to_string(shape));
  }
  if (out.dtype() != dtype) {
    throw Error(ErrorCode::DTypeMismatch, "GroupedLinear." + what + " is " +
                                              std::string(dtype_name(out.dtype())) + ", expected " +
                                              std::string(dtype_name(dtype)));
  }
  if (!out.writable()) {
    throw Error(ErrorCode::ReadOnlyTensor, "GroupedLinear." + what + " is read-only");
  }
  for (const Tensor* in : inputs) {
    if (detail::overlap(out, *in)) {
      throw Error(ErrorCode::InvalidArgument,
                  "GroupedLinear." + what + " shares bytes with an input; expected its own");
    }
  }
}

}  // namespace

Tensor GroupedLinear::forward(const Tensor& x, std::span<const int64_t> m_splits) {
  check_forward_args(x, m_splits);
  Tensor y = Tensor::empty({x.dim(0), options_.out_features}, activations_);
  forward(x, m_splits, y);
  return y;
}

void GroupedLinear::forward(const Tensor& x, std::span<const int64_t> m_splits, Tensor& y) {
  check_forward_args(x, m_splits);
  check_output(y, {x.dim(0), options_.out_features}, activations_, "forward: y", {&x});
  const int64_t n = num_gemms();
  std::vector<Tensor> weights, scales, biases;
  for (int64_t i = 0; i < n; ++i) {
    weights.push_back(expert_weight(i));
    if (options_.params_dtype == DType::F8_E4M3) scales.push_back(expert_weight_scale(i));
    if (options_.bias) biases.push_back(expert_bias(i));
  }
  std::vector<const std::byte*> packed;
  if (packed_) packed = packed_->refresh(weights, x.dtype());
  kernels::grouped_forward(x, m_splits, weights, scales, biases, y, packed);
  saved_x_ = x;
  saved_splits_.assign(m_splits.begin(), m_splits.end());
  has_saved_ = true;
}

GroupedLinear::~GroupedLinear() = default;

void GroupedLinear::set_weight_packing(bool on) {
  if (!on) {
    packed_.reset();
  } else if (!packed_) {
    packed_ = std::make_unique<PackedWeightCache>();
  }
}

size_t GroupedLinear::packed_weight_bytes() const { return packed_ ? packed_->bytes() : 0; }

void GroupedLinear::mark_weights_written() {
  for (int64_t i = 0; i < num_gemms(); ++i) {
    const Tensor w = expert_weight(i);
    if (w.defined()) w.storage()->mark_written();
  }
}

void GroupedLinear::allocate_grads() {
  // Gradients mirror the layout of the parameters: one [N, ...] tensor for Single, one group
  // for Contiguous, separate tensors for PerExpert; weights and biases each in their own.
  const int64_t n = num_gemms(), in = options_.in_features, out = options_.out_features;
  const DType dt = activations_;
  const bool fp8 = options_.params_dtype == DType::F8_E4M3;  // weights without gradients
  if (layout_ == WeightLayout::Contiguous && !fp8) {
    if (options_.fuse_wgrad_accumulation) {
      main_grad_group_ = GroupedTensor::make_uniform(n, {out, in}, DType::F32);
    } else {
      weight_grad_group_ = GroupedTensor::make_uniform(n, {out, in}, dt);
    }
  }
  if (options_.bias && bias_layout_ == WeightLayout::Contiguous) {
    bias_grad_group_ = GroupedTensor::make_uniform(n, {out}, dt);
  }
  for (size_t k = 0; k < parameters().size(); ++k) {
    Parameter& p = parameter_at(k);
    const bool is_weight = k < first_bias_param();
    if (is_weight && fp8) continue;
    const bool fused = is_weight && options_.fuse_wgrad_accumulation;
    // Expert index of a per-expert parameter (unused for Single).
    const auto i = static_cast<int64_t>(is_weight ? k : k - first_bias_param());
    if ((is_weight ? layout_ : bias_layout_) == WeightLayout::Contiguous) {
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
  // An undefined or wrongly shaped dy is reported by the overload before dx is used.
  const int64_t t = has_saved_ ? saved_x_.dim(0) : 0;
  Tensor dx = Tensor::empty({t, options_.in_features}, activations_);
  backward(dy, dx);
  return dx;
}

void GroupedLinear::backward(const Tensor& dy, Tensor& dx) {
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
  if (dy.dtype() != activations_) {
    throw Error(ErrorCode::DTypeMismatch, "GroupedLinear.backward: dy is " +
                                              std::string(dtype_name(dy.dtype())) + ", expected " +
                                              std::string(dtype_name(activations_)));
  }
  check_output(dx, {t, options_.in_features}, activations_, "backward: dx", {&dy, &saved_x_});
  if (!grads_allocated_) {
    allocate_grads();
    grads_allocated_ = true;
  }

  const int64_t n = num_gemms();
  const bool fp8 = options_.params_dtype == DType::F8_E4M3;
  std::vector<Tensor> weights, scales, wgrads, bgrads;
  for (int64_t i = 0; i < n; ++i) {
    weights.push_back(expert_weight(i));
    if (fp8) {
      scales.push_back(expert_weight_scale(i));
    } else {
      wgrads.push_back(options_.fuse_wgrad_accumulation ? expert_main_grad(i)
                                                        : expert_weight_grad(i));
    }
    if (options_.bias) bgrads.push_back(expert_bias_grad(i));
  }
  kernels::grouped_dgrad(dy, saved_splits_, weights, scales, dx);
  if (!fp8) {
    kernels::grouped_wgrad(saved_x_, dy, saved_splits_, wgrads, options_.fuse_wgrad_accumulation);
  }
  if (options_.bias) kernels::grouped_bgrad(dy, saved_splits_, bgrads);
}

}  // namespace grouplin
