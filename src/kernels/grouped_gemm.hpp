// Grouped GEMM kernels behind GroupedLinear: forward, dgrad, wgrad and bgrad over the row
// ranges given by m_splits. Internal header: GroupedLinear checks every argument before calling.
// The only error they raise is Error(InvalidEnvironment) for a bad GROUPLIN_ISA or
// GROUPLIN_NUM_THREADS (kernel_isa, num_threads), thrown before any output is written.
//
//   kernels::grouped_forward(x, m_splits, weights, biases, y);   // y_i = x_i · W_iᵀ + b_i
//   kernels::grouped_dgrad(dy, m_splits, weights, dx);            // dx_i = dy_i · W_i
//   kernels::grouped_wgrad(x, dy, m_splits, wgrads, false);       // dW_i = dy_iᵀ · x_i
//
// How: each call plans tiles from the shapes and m_splits alone (gemm_plan.hpp), orders them
// largest-first, and runs them on a fixed pool of threads (thread_pool.hpp, GROUPLIN_NUM_THREADS)
// that take tiles from one atomic counter; one tile is one output block of one expert, computed
// by the loops in tile_compute.hpp on the micro-kernels in micro_kernels.hpp (portable, AVX2+FMA,
// AVX-512F, AVX512-BF16 or AMX-BF16: the CPU's best, capped by GROUPLIN_ISA). Plans that cost less
// than a few tens of microseconds run on the calling thread alone. The calling thread keeps its
// scratch from call to call: per worker, room for the plan's largest tile (1-6 MiB, its pages
// touched only as far as the tiles use them).
//
// Data tensors (x, y, dy, dx) are [T, features] in the params dtype (F32 or BF16; beside FP8
// weights, F32 or BF16 activations, as beside F32 weights); expert tensors are per-expert views
// in any storage. FP8 weights are decoded where the kernels read them (packing.hpp), a tile at a
// time or in registers. All accumulation
// is F32, and F32 operands are never narrowed; BF16 operands are widened exactly (or, for BF16 x
// BF16 forward and dgrad products on the AVX512-BF16 and AMX sets, multiplied as BF16 pairs into
// F32 sums: tile_paths.hpp, forward_path) and results rounded to nearest even once at the end.
//
// Determinism guarantee. On one machine (one set of micro-kernels), the bits of every result
// depend only on the input values, the shapes and m_splits: never on the thread count, the
// scheduling, the weight layout or addresses, or the run. Every output element is computed by
// exactly one tile as one chain of operations in a fixed order: forward sums over in_features in
// order (fused multiply-adds; experts with few rows, and the last few rows of some experts, use
// 8 interleaved partial sums per block instead: the chain depends on the expert's row count and
// the weights' dtype, see forward_chain in tile_paths.hpp), dgrad over out_features in order,
// wgrad and bgrad over the expert's rows in order. The tiling only decides which
// thread computes an element, not how. Accumulated weight gradients are old + fresh, one F32
// addition per element. The AVX-512 sets give the AVX2 set's F32 bits (and its bits for BF16
// wherever they widen); their pair kernels, and the portable micro-kernels, round differently.
#pragma once

#include <cstdint>
#include <span>

#include "grouplin/tensor.hpp"
#include "kernels/micro_kernels.hpp"

namespace grouplin::kernels {

// y_i = x_i · W_iᵀ (+ b_i when biases is not empty). Writes every row of y.
// Requires: x [T, in], y [T, out], weights[i] [out, in], biases empty or biases[i] [out],
// sum(m_splits) == T. FP8 weights: weights[i] F8_E4M3 and weight_scales[i] F32
// [ceil(out / kFp8Block), ceil(in / kFp8Block)] (micro_kernels.hpp: 128) (empty for F32 and BF16
// weights); they compute as F32 weights holding their dequantized values (code x scale, one F32
// multiply) would, bit for bit, beside x of either dtype (BF16 widened exactly).
// packed: empty, or per expert its weights packed by pack_forward_weights (packed_weights.hpp)
// from their current values, or null; used where the tile runs on pair kernels (same bits).
void grouped_forward(const Tensor& x, std::span<const int64_t> m_splits,
                     std::span<const Tensor> weights, std::span<const Tensor> weight_scales,
                     std::span<const Tensor> biases, Tensor& y,
                     std::span<const std::byte* const> packed = {});

// dx_i = dy_i · W_i. Writes every row of dx. FP8 weights as grouped_forward's (dy's dtype).
void grouped_dgrad(const Tensor& dy, std::span<const int64_t> m_splits,
                   std::span<const Tensor> weights, std::span<const Tensor> weight_scales,
                   Tensor& dx);

// dW_i = dy_iᵀ · x_i, written into wgrads[i] (or added, when accumulate, to the F32 wgrads[i]).
// Experts with no rows get zeros (or are left unchanged when accumulating).
void grouped_wgrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> m_splits,
                   std::span<Tensor> wgrads, bool accumulate);

// db_i = column sums of dy_i, summed in row order (deterministic). Zero for empty experts.
void grouped_bgrad(const Tensor& dy, std::span<const int64_t> m_splits, std::span<Tensor> bgrads);

}  // namespace grouplin::kernels
