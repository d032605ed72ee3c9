// GroupedLinear: N experts, y_i = x_i · W_iᵀ + b_i over rows split by m_splits.
//
//   grouplin::GroupedLinearOptions o;
//   o.num_gemms = 8; o.in_features = 512; o.out_features = 1024;
//   o.weight_layout = grouplin::WeightLayout::Single;     // or PerExpert, Contiguous
//   grouplin::GroupedLinear fc1(o);
//   std::vector<int64_t> m_splits = {3, 0, 5, 2, 2, 0, 1, 3};  // rows of x per expert, sum = T
//   grouplin::Tensor x = grouplin::Tensor::zeros({16, 512}, grouplin::DType::F32);
//   grouplin::Tensor y = fc1.forward(x, m_splits);          // x [T, 512] -> y [T, 1024]
//   grouplin::Tensor dy = grouplin::Tensor::zeros({16, 1024}, grouplin::DType::F32);
//   grouplin::Tensor dx = fc1.backward(dy);                   // fills weight and bias grads
//
// The three layouts hold bit-identical values from the same seed and give bit-identical
// results. Not thread-safe: one thread calls forward/backward at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grouplin/grouped_tensor.hpp"
#include "grouplin/layout.hpp"
#include "grouplin/module.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin {

class PackedWeightCache;  // nn/packed_weight_cache.hpp

// The environment variable that selects Contiguous when weight_layout is not given.
inline constexpr const char* kContiguousWeightsEnv = "NVTE_ALLOC_CONTIGUOUS_GROUPED_LINEAR_WEIGHTS";

// The layout to use: `requested` if given, else Contiguous when kContiguousWeightsEnv is truthy
// (1 true yes on), else PerExpert. Accepted values are case-insensitive; 0 false no off and the
// empty string mean false. Throws Error(InvalidEnvironment) naming the variable, its value and
// the accepted values for anything else.
WeightLayout resolve_weight_layout(std::optional<WeightLayout> requested);

struct GroupedLinearOptions {
  int64_t num_gemms = 1;  // N, the number of experts (>= 1)
  int64_t in_features = 1;
  int64_t out_features = 1;
  bool bias = true;
  // F32 or BF16 (inputs, outputs and biases use the same dtype), or F8_E4M3: FP8 weights for
  // inference, codes with one F32 scale per 128 x 128 block (DeepSeek-V3's form: buffers
  // weight{i}_scale_inv, or weight_scale_inv [N, ...] in the Single layout), computed as F32
  // weights holding their dequantized values (code x scale in F32, PyTorch's rule) would,
  // beside activations of either dtype, except with BF16 activations on AVX512-BF16 with VBMI
  // (AMD Zen 4) forward and dx, summed in BF16 pairs and scaled per 128-block as block-scaled
  // FP8 GEMMs do (docs/api.md); they have no gradient (Fp8WeightsNotTrainable).
  DType params_dtype = DType::F32;
  // The dtype of x, y, dy, dx and the biases beside FP8 weights: F32 or BF16 (unset: BF16).
  // For F32 and BF16 weights it must be unset or params_dtype.
  std::optional<DType> activation_dtype{};
  std::optional<WeightLayout> weight_layout{};  // unset: see resolve_weight_layout
  // The biases' own layout (TransformerEngine chooses single_grouped_weight and
  // single_grouped_bias separately); unset: the weights' layout.
  std::optional<WeightLayout> bias_layout{};
  // Accumulate weight gradients into F32 Parameter::main_grad instead of overwriting grad.
  bool fuse_wgrad_accumulation = false;
  uint64_t seed = 0;  // initialisation is a pure function of (seed, options)
  // The index of expert 0 in a larger layer (one rank's experts of an expert-parallel layer):
  // expert i is initialised as expert first_expert + i of that layer. >= 0.
  int64_t first_expert = 0;
};

class GroupedLinear : public Module {
 public:
  // Builds and initialises the layer: W_i ~ U(-1/sqrt(in), 1/sqrt(in)), same for b_i, drawn
  // from `seed` in expert order, identical in every layout.
  // FP8 weights are those values quantized per 128 x 128 block (scale = the block's largest
  // magnitude / 448, codes rounded to nearest even).
  // Throws Error(InvalidArgument) for N < 1 or features < 1, Error(UnsupportedDType) for
  // params_dtype other than F32/BF16/F8_E4M3 (or an activation_dtype other than those allowed),
  // Error(Fp8WeightsNotTrainable) for FP8 weights with fuse_wgrad_accumulation,
  // Error(InvalidEnvironment) (see resolve_weight_layout).
  explicit GroupedLinear(const GroupedLinearOptions& options);
  ~GroupedLinear() override;

  // y [T, out] for x [T, in] whose first m_splits[0] rows go to expert 0, the next m_splits[1]
  // to expert 1, and so on. Keeps x and m_splits for backward.
  // Throws Error(SplitCountMismatch | NegativeSplit | SplitSumMismatch | ShapeMismatch |
  // DTypeMismatch), and Error(InvalidEnvironment) for a bad GROUPLIN_ISA or GROUPLIN_NUM_THREADS
  // (runtime.hpp); a failed call changes nothing.
  Tensor forward(const Tensor& x, std::span<const int64_t> m_splits);
  // forward into `y`, the caller's [T, out] tensor of the params dtype (writable, sharing no
  // bytes with x): no tensor is allocated, so a training loop can reuse its buffers. Throws as
  // forward, and Error(ShapeMismatch | DTypeMismatch | ReadOnlyTensor | InvalidArgument) for y;
  // a failed call changes nothing.
  void forward(const Tensor& x, std::span<const int64_t> m_splits, Tensor& y);

  // dx [T, in] for dy [T, out]. Writes each parameter's grad (or adds the weight gradient to
  // main_grad with fuse_wgrad_accumulation). Experts with no rows get zero gradients (their
  // main_grad is left unchanged). Bias gradients are summed in row order: same inputs, same bits.
  // FP8 weights: dx and the bias gradients only (their weights have no gradient).
  // Throws Error(BackwardBeforeForward | ShapeMismatch | DTypeMismatch); a failed call changes
  // nothing.
  Tensor backward(const Tensor& dy);
  // backward into `dx`, the caller's [T, in] tensor of the params dtype (writable, sharing no
  // bytes with dy or the saved x). After the first call (which allocates the gradients) no tensor
  // is allocated. Throws as backward, and as forward(x, m_splits, y) does for y.
  void backward(const Tensor& dy, Tensor& dx);

  // Weight packing, for many forwards with the same weights (inference): while on, forward reads
  // the weights from a copy in the layout the matrix kernels multiply (BF16 weights and
  // activations on a CPU whose kernels take BF16 pairs: AVX512-BF16, AMX; elsewhere nothing is
  // kept), made at the first forward and again, expert by expert, after a weight's bytes change
  // through GroupLin (any mutable_data of their storage: sgd_step, load_state_dict, copy_from).
  // Same bits as without; costs packed_weight_bytes() (about the BF16 weights' size). Off by
  // default; off frees the copy.
  void set_weight_packing(bool on);
  bool weight_packing() const { return packed_ != nullptr; }
  size_t packed_weight_bytes() const;
  // Tells the packing that the weights were written where GroupLin cannot see (through a pointer
  // taken before, a NumPy or PyTorch view, memory a borrowed weight aliases): the next forward
  // packs them again.
  void mark_weights_written();

  const GroupedLinearOptions& options() const { return options_; }
  WeightLayout layout() const { return layout_; }  // of the weights
  WeightLayout bias_layout() const { return bias_layout_; }
  int64_t num_gemms() const { return options_.num_gemms; }
  // The dtype of x, y, dy, dx and the biases.
  DType activation_dtype() const { return activations_; }

  // Views of expert i's weight [out, in] and bias [out] (undefined without bias) and of their
  // grads (undefined before the first backward). Throws Error(OutOfBounds); the weight grads of
  // FP8 weights Error(Fp8WeightsNotTrainable).
  Tensor expert_weight(int64_t i) const;
  // Expert i's FP8 block scales [ceil(out / 128), ceil(in / 128)] F32 (undefined for F32 and BF16
  // weights). Throws Error(OutOfBounds).
  Tensor expert_weight_scale(int64_t i) const;
  Tensor expert_bias(int64_t i) const;
  Tensor expert_weight_grad(int64_t i) const;
  Tensor expert_bias_grad(int64_t i) const;
  Tensor expert_main_grad(int64_t i) const;

 protected:
  // Claims its own entries by name, in the form the load planner wrote them for this module
  // (per-expert or single, whatever the checkpoint's layout: load_state_dict.hpp); _extra_state
  // is optional.
  void plan_load(const LoadSource& source, const std::string& prefix, LoadPlan& plan) override;

 private:
  // Expert i's weight (or bias) parameter; Single layout has one of each for all experts.
  const Parameter& weight_param(int64_t i) const;
  const Parameter* bias_param(int64_t i) const;
  // View of expert i inside a parameter-shaped tensor of `layout` (Single: one [N, ...] tensor).
  static Tensor expert_view(const Tensor& t, int64_t i, WeightLayout layout);
  // Index of the first bias parameter (the weights come first).
  size_t first_bias_param() const;
  // Index of expert i's FP8 scale buffer (the Single layout's one for all experts); _extra_state
  // is buffer 0, the scales follow.
  size_t scale_buffer(int64_t i) const;
  void allocate_grads();
  void check_forward_args(const Tensor& x, std::span<const int64_t> m_splits) const;

  GroupedLinearOptions options_;
  WeightLayout layout_;
  WeightLayout bias_layout_;
  // Contiguous layout: the one allocation that the per-expert weights and biases view.
  GroupedTensor weight_group_, bias_group_, scale_group_;
  DType activations_;
  GroupedTensor weight_grad_group_, bias_grad_group_, main_grad_group_;
  // Saved by forward for backward.
  Tensor saved_x_;
  std::vector<int64_t> saved_splits_;
  bool has_saved_ = false;
  bool grads_allocated_ = false;
  std::unique_ptr<PackedWeightCache> packed_;  // while weight packing is on
};

}  // namespace grouplin
