// The grouped GEMM of GroupedLinear as plain functions: every input given, nothing kept between
// calls, so that any number of forwards may be in flight before their backwards (autograd
// functions, the expert block, several threads each with its own tensors).
//
//   using grouplin::DType, grouplin::Tensor;
//   Tensor weight = Tensor::zeros({4, 32, 16}, DType::F32);  // [N, out, in]
//   Tensor bias = Tensor::zeros({4, 32}, DType::F32);        // [N, out]
//   grouplin::ExpertWeights w = grouplin::ExpertWeights::stacked(weight, {}, bias);
//   std::vector<int64_t> m_splits = {3, 0, 2, 1};  // rows of x per expert: T = 6
//   Tensor x = Tensor::zeros({6, 16}, DType::F32), dy = Tensor::zeros({6, 32}, DType::F32);
//   Tensor y = grouplin::grouped_linear_forward(x, m_splits, w);  // [6, 32]
//   grouplin::GroupedGrads g = grouplin::grouped_linear_backward(x, dy, m_splits, w);
//
// Rows of x belong to the experts in order, m_splits[i] of them to expert i:
// y_i = x_i · W_iᵀ + b_i, dx_i = dy_i · W_i, dW_i = dy_iᵀ · x_i, db_i = column sums of dy_i.
// The bits are GroupedLinear's (docs/api.md, "Determinism"): the same for any thread count, any
// weight layout and any number of calls in flight.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "grouplin/tensor.hpp"

namespace grouplin {

// The experts of one grouped GEMM as a call reads them: N per-expert views, in any storage.
struct ExpertWeights {
  std::vector<Tensor> weights;  // N tensors [out, in]: F32, BF16, or F8_E4M3 codes
  std::vector<Tensor> scales;   // F8_E4M3 weights only: N F32 [ceil(out/128), ceil(in/128)]
  std::vector<Tensor> biases;   // empty, or N tensors [out] of the activations' dtype

  // Views of stacked tensors: weight [N, out, in], scales [N, ceil(out/128), ceil(in/128)]
  // (FP8 weights; else undefined), bias [N, out] or undefined. No copy.
  static ExpertWeights stacked(const Tensor& weight, const Tensor& scales = {},
                               const Tensor& bias = {});
};

// y [T, out] for x [T, in] (F32 or BF16; beside FP8 weights, F32 or BF16): every row written.
// F32 and BF16 weights take x of their own dtype. Throws, naming the argument:
// SplitCountMismatch (m_splits.size() != N), NegativeSplit, SplitSumMismatch (sum != T),
// ShapeMismatch and DTypeMismatch (x, a weight, scale or bias, y), UndefinedTensor,
// ReadOnlyTensor and InvalidArgument (y not writable, or sharing bytes with x).
Tensor grouped_linear_forward(const Tensor& x, std::span<const int64_t> m_splits,
                              const ExpertWeights& w);
void grouped_linear_forward(const Tensor& x, std::span<const int64_t> m_splits,
                            const ExpertWeights& w, Tensor& y);

// What grouped_linear_backward computes.
struct GradsWanted {
  bool dx = true;
  bool dw = true;  // not for FP8 weights (Fp8WeightsNotTrainable)
  bool db = true;  // only when w has biases
};

struct GroupedGrads {
  Tensor dx;  // [T, in], x's dtype; undefined unless wanted
  Tensor dw;  // [N, out, in], the weights' dtype (dw.select(i): expert i); undefined unless wanted
  Tensor db;  // [N, out], x's dtype; undefined unless wanted (and w has biases)
};

// The gradients of y = grouped_linear_forward(x, m_splits, w) for dy [T, out] (x's dtype).
// Throws what grouped_linear_forward throws for the same arguments, for dy too, and
// Error(Fp8WeightsNotTrainable) when dW of FP8 weights is wanted.
GroupedGrads grouped_linear_backward(const Tensor& x, const Tensor& dy,
                                     std::span<const int64_t> m_splits, const ExpertWeights& w,
                                     GradsWanted wanted = {});

}  // namespace grouplin
