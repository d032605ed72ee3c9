// The baselines `grouplin bench` measures GroupLin's grouped GEMM against, in the same run:
// one dense OpenBLAS sgemm of the same total work, the plain per-expert loop of OpenBLAS calls
// (GroupLin's kernels before issue 6, kept here verbatim in behaviour), and a memory copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "grouplin/tensor.hpp"

namespace grouplin::bench {

// One dense F32 sgemm with the shapes of the whole grouped call, all T rows against expert 0:
// forward y = x·Wᵀ, dgrad dx = dy·W, wgrad dW = dyᵀ·x. Requires F32 tensors.
void dense_forward(const Tensor& x, const Tensor& w, Tensor& y);
void dense_dgrad(const Tensor& dy, const Tensor& w, Tensor& dx);
void dense_wgrad(const Tensor& x, const Tensor& dy, Tensor& dw);

// The per-expert loop: one OpenBLAS call per expert with rows (BF16 operands widened to F32
// copies per expert, results rounded back), bias gradients by a plain row loop.
void loop_forward(const Tensor& x, std::span<const int64_t> m_splits,
                  std::span<const Tensor> weights, std::span<const Tensor> biases, Tensor& y);
void loop_dgrad(const Tensor& dy, std::span<const int64_t> m_splits,
                std::span<const Tensor> weights, Tensor& dx);
void loop_wgrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> m_splits,
                std::span<Tensor> wgrads);
void loop_bgrad(const Tensor& dy, std::span<const int64_t> m_splits, std::span<Tensor> bgrads);

// Copies `bytes` bytes from src to dst on the kernels' thread pool (one chunk per thread).
void parallel_copy(const std::byte* src, std::byte* dst, size_t bytes);

// OpenBLAS's idle threads spin (sched_yield) for OPENBLAS_THREAD_TIMEOUT cycles after each
// call, 2^28 (~0.1 s) by default, and slow down whatever runs next on their core by up to 2x.
// ensure_short_blas_spin() re-executes the program with OPENBLAS_THREAD_TIMEOUT=22 (~1 ms:
// still spanning the gaps between a loop's calls) when it is not set; OpenBLAS reads it only at
// start-up. let_blas_threads_sleep() then waits those few milliseconds after a BLAS variant.
void ensure_short_blas_spin();
void let_blas_threads_sleep();

// Whether this build has OpenBLAS (an optional dependency): without it the dense and loop
// baselines above must not be called, and bench says they are absent.
bool blas_available();

// Sets the threads of OpenBLAS (for the baselines) and of the GroupLin kernels.
void set_threads(int n);

// "OpenBLAS 0.3.21 ... (core Cooperlake)".
const char* blas_description();

}  // namespace grouplin::bench
