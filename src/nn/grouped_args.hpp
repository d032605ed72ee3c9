// Private: the argument checks that the stateless grouped GEMM (grouped_gemm.cpp) and
// GroupedLinear share, so that both name a bad argument the same way.
#pragma once

#include <cstdint>
#include <span>

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

}  // namespace grouplin::detail
