// Grouped GEMM kernels behind GroupedLinear: forward, dgrad, wgrad and bgrad over the row
// ranges given by m_splits. Internal header: GroupedLinear checks every argument before calling.
//
// Data tensors (x, y, dy, dx) are [T, features] in the params dtype (F32 or BF16); expert
// tensors are per-expert views in any storage. All arithmetic is F32 with F32 accumulation;
// BF16 operands are widened exactly and results rounded to nearest even once at the end.
// Results depend only on values, never on addresses or thread count.
#pragma once

#include <cstdint>
#include <span>

#include "grouplin/tensor.hpp"

namespace grouplin::kernels {

// y_i = x_i · W_iᵀ (+ b_i when biases is not empty). Writes every row of y.
// Requires: x [T, in], y [T, out], weights[i] [out, in], biases empty or biases[i] [out],
// sum(m_splits) == T.
void grouped_forward(const Tensor& x, std::span<const int64_t> m_splits,
                     std::span<const Tensor> weights, std::span<const Tensor> biases, Tensor& y);

// dx_i = dy_i · W_i. Writes every row of dx.
void grouped_dgrad(const Tensor& dy, std::span<const int64_t> m_splits,
                   std::span<const Tensor> weights, Tensor& dx);

// dW_i = dy_iᵀ · x_i, written into wgrads[i] (or added, when accumulate, to the F32 wgrads[i]).
// Experts with no rows get zeros (or are left unchanged when accumulating).
void grouped_wgrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> m_splits,
                   std::span<Tensor> wgrads, bool accumulate);

// db_i = column sums of dy_i, summed in row order (deterministic). Zero for empty experts.
void grouped_bgrad(const Tensor& dy, std::span<const int64_t> m_splits, std::span<Tensor> bgrads);

}  // namespace grouplin::kernels
