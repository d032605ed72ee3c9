// The experts of one Mixture-of-Experts layer, whole: routing, the first projection (gate/up, or
// up alone), the gate, the down projection and the weighted combine, forward and backward, over
// explicit inputs (nothing kept between calls but what the caller keeps).
//
//   using grouplin::DType, grouplin::Tensor;
//   // E = 4 experts, H = 16, I = 32, T = 3 tokens, K = 2 experts per token
//   Tensor gate_up = Tensor::zeros({4, 64, 16}, DType::F32);  // [E, 2I, H]: gate rows, then up
//   Tensor down = Tensor::zeros({4, 16, 32}, DType::F32);     // [E, H, I]
//   grouplin::ExpertBlockWeights w{grouplin::ExpertWeights::stacked(gate_up),
//                                  grouplin::ExpertWeights::stacked(down)};
//   Tensor hidden = Tensor::zeros({3, 16}, DType::F32);
//   Tensor index = Tensor::zeros({3, 2}, DType::I64), weights = Tensor::zeros({3, 2}, DType::F32);
//   grouplin::ExpertBlockResult r = grouplin::expert_block_forward(hidden, index, weights, w, {},
//                                                                  /*save=*/true);
//   Tensor d_out = Tensor::zeros({3, 16}, DType::F32);
//   grouplin::ExpertBlockGrads g =
//       grouplin::expert_block_backward(d_out, hidden, weights, w, {}, r.saved);
//
// For each token t and slot k, expert e = top_k_index[t, k] sees row hidden[t]:
//   h = hidden[t] · first_eᵀ (+ first bias),  a = gate(h),  y = a · down_eᵀ (+ down bias),
//   out[t] = Σ_k top_k_weights[t, k] · y   (F32 sums in slot order, then hidden's dtype).
// Ids >= E (expert parallelism's sentinels: experts another rank holds) add nothing.
//
// Rows are routed by a stable counting sort of the ids: each expert's rows in token order, the
// two projections are the stateless grouped GEMM (grouped_gemm.hpp), the gate and the combine run
// row by row on the kernels' threads. The bits depend only on the inputs: never on the thread
// count or the run. BF16 activations are rounded to BF16 after each step where a BF16 PyTorch
// module rounds (the projections, the activation, each product), F32 inside each step.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "grouplin/grouped_gemm.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin {

// The activation of the gate (or, without a gate, of the whole first projection).
enum class ExpertActivation : uint8_t {
  SiLU,      // x · sigmoid(x)
  GELU,      // x · Φ(x), the erf form
  GELUTanh,  // the tanh approximation of GELU
  ReLU,      // max(x, 0)
  ReLU2,     // max(x, 0)²
};

// How the first projection's row h becomes the down projection's input a. `gate` and `up` are
// h's two halves (or, interleaved, its even and odd columns); L is ExpertGate::limit.
enum class ExpertGateKind : uint8_t {
  None,         // a = act(h): no gate; the first projection is up, I rows per expert
  Multiply,     // a = act(gate) · up
  ClampBefore,  // a = act(min(gate, L)) · clamp(up, -L, L)
  ClampAfter,   // a = min(act(gate), L) · clamp(up, -L, L)
  GluPlusOne,   // a = (clamp(up, -L, L) + 1) · g · sigmoid(alpha · g), g = min(gate, L)
};

struct ExpertGate {
  ExpertGateKind kind = ExpertGateKind::Multiply;
  ExpertActivation activation = ExpertActivation::SiLU;  // unused by GluPlusOne
  bool interleaved = false;  // h's columns alternate gate, up (else: all gate, then all up)
  float limit = std::numeric_limits<float>::infinity();
  float alpha = 1.702f;  // GluPlusOne only
};

// The two projections of E experts. Each expert's weight is [out, in] (first: [2I, H] with a
// gate, else [I, H]; down: [H, I]), or, when `transposed`, stored [in, out] ([H, 2I] and [I, H]).
// F32, BF16, or F8_E4M3 codes with their 128 x 128 F32 scales (as ExpertWeights holds them;
// FP8 scales follow the weight as stored). Biases: none, or one [out] per expert for both.
struct ExpertBlockWeights {
  ExpertWeights first;
  ExpertWeights down;
  bool transposed = false;
};

// What backward needs from its forward (kept by the caller between the two).
struct ExpertBlockSaved {
  std::vector<int64_t> m_splits;     // routed rows per expert
  std::vector<int64_t> row_of_slot;  // [T * K]: the routed row of slot t * K + k, or -1
  Tensor h;                          // [R, 2I] (or [R, I]): the first projection, biases added
  Tensor y;                          // [R, H]: the down projection, biases added
};

struct ExpertBlockResult {
  Tensor out;              // [T, H], hidden's dtype
  ExpertBlockSaved saved;  // filled only when the forward was asked to save
};

// out for hidden [T, H] (F32 or BF16: the weights' dtype; beside FP8 weights, either),
// top_k_index [T, K] (I64 or I32) and top_k_weights [T, K] (F32, BF16 or F16). Throws, naming
// the argument: ShapeMismatch, DTypeMismatch (biases are in hidden's dtype), UndefinedTensor,
// InvalidArgument (a negative expert id, a gate whose first projection has an odd row count),
// and what grouped_linear_forward throws for the weights.
ExpertBlockResult expert_block_forward(const Tensor& hidden, const Tensor& top_k_index,
                                       const Tensor& top_k_weights, const ExpertBlockWeights& w,
                                       const ExpertGate& gate, bool save = false);

struct ExpertBlockGradsWanted {
  bool hidden = true;
  bool top_k_weights = true;
  bool weights = true;  // not for FP8 weights (Fp8WeightsNotTrainable)
  bool biases = true;   // only when the weights have biases
};

// The gradients of expert_block_forward's out. Each is undefined unless wanted; weight
// gradients are stacked in the weights' orientation ([E, out, in], or [E, in, out] transposed)
// and dtype, bias gradients [E, out] in hidden's dtype.
struct ExpertBlockGrads {
  Tensor hidden;         // [T, H], hidden's dtype
  Tensor top_k_weights;  // [T, K], top_k_weights' dtype (zero for sentinel slots)
  Tensor first, first_bias;
  Tensor down, down_bias;
};

// Gradients for d_out [T, H] (hidden's dtype), from the same hidden, top_k_weights, weights and
// gate as the forward that made `saved` (with save = true). Throws ShapeMismatch or
// DTypeMismatch naming the argument, Error(BackwardBeforeForward) for a `saved` that does not
// fit these shapes, Error(Fp8WeightsNotTrainable) when FP8 weight gradients are wanted.
ExpertBlockGrads expert_block_backward(const Tensor& d_out, const Tensor& hidden,
                                       const Tensor& top_k_weights, const ExpertBlockWeights& w,
                                       const ExpertGate& gate, const ExpertBlockSaved& saved,
                                       ExpertBlockGradsWanted wanted = {});

}  // namespace grouplin
