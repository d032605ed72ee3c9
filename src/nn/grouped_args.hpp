// Private: the argument checks that the stateless grouped GEMM (grouped_gemm.cpp),
// GroupedLinear and the expert block share, so that all three name a bad argument the same way.
#pragma once

#include <cstdint>
#include <span>

#include "grouplin/grouped_gemm.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin::detail {

// `t` (named `what` in messages of `op`) is defined, [rows, cols] (rows < 0: any) and `dtype`:
// Error(UndefinedTensor), Error(ShapeMismatch) or Error(DTypeMismatch) otherwise.
void check_rows(const char* op, const char* what, const Tensor& t, int64_t rows, int64_t cols,
                DType dtype);

// m_splits has one entry per expert, none negative, summing to `rows`:
// Error(SplitCountMismatch), Error(NegativeSplit) or Error(SplitSumMismatch) otherwise.
void check_splits(const char* op, std::span<const int64_t> m_splits, int64_t experts, int64_t rows);

// Whether `a` and `b` share a byte, by address, not by Storage (a borrowed weight is a read-only
// alias of the caller's storage): an output must not overlap an input.
bool overlap(const Tensor& a, const Tensor& b);

// The experts' shapes and dtype, checked once: N, out, in (as stored), the weights' dtype.
struct ExpertShapes {
  int64_t n = 0, out = 0, in = 0;
  DType dtype = DType::F32;
};

// Every weight [out, in] of one dtype (F32, BF16 or F8_E4M3), FP8 weights with their scales,
// biases none or one per expert: InvalidArgument, ShapeMismatch, DTypeMismatch or
// UnsupportedDType otherwise, naming weights[i] or scales[i].
ExpertShapes check_experts(const char* op, const ExpertWeights& w);

// x [T, s.in] in the activations' dtype beside these weights (their own; F32 or BF16 beside
// FP8), which it returns.
DType check_activations(const char* op, const ExpertShapes& s, const Tensor& x);

// Each bias [s.out] in the activations' dtype `a`.
void check_biases(const char* op, const ExpertWeights& w, const ExpertShapes& s, DType a);

}  // namespace grouplin::detail
