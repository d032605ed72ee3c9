// Private: what the expert block's element-wise passes (the gate, gathers, the combine) share:
// element access for F32 and BF16 activations, and a loop over row blocks on the kernels' threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "grouplin/dtype.hpp"
#include "kernels/thread_pool.hpp"

namespace grouplin::block {

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(uint16_t* p, int64_t i, float v) { p[i] = f32_to_bf16(v); }

// Calls fn(i) for every i in [0, count), `block` consecutive i per task, on the kernels' threads.
// Each i is one task's alone, so results never depend on the thread count.
template <class Fn>
void for_each_in_blocks(int64_t count, int64_t block, Fn fn) {
  const size_t blocks = static_cast<size_t>((count + block - 1) / block);
  if (blocks == 0) return;
  kernels::run_tasks(blocks, kernels::workers_for(blocks), [&](size_t b, int) {
    const int64_t begin = static_cast<int64_t>(b) * block;
    for (int64_t i = begin; i < std::min(count, begin + block); ++i) fn(i);
  });
}

}  // namespace grouplin::block
