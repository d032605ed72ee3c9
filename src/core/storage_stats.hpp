// Private: process-wide counters of what Storage allocates and what tensors copy, for the tests
// that prove a path (a zero-copy load, a training step into the caller's buffers) allocates or
// copies nothing extra. Not part of the public API: the counts say how GroupLin does its work,
// not what it promises.
//
//   const grouplin::detail::StorageStats before = grouplin::detail::storage_stats();
//   layer.forward(x, m_splits, y);
//   EXPECT_EQ(grouplin::detail::storage_stats().allocations, before.allocations);
#pragma once

#include <cstdint>

namespace grouplin::detail {

struct StorageStats {
  uint64_t allocations = 0;      // Storage::allocate calls
  uint64_t allocated_bytes = 0;  // bytes requested by those calls
  uint64_t copied_bytes = 0;     // bytes moved by Tensor::copy_from (including conversions)
};

// The counters so far (relaxed atomic reads: exact when no other thread allocates meanwhile).
StorageStats storage_stats();

// Adds `n` to copied_bytes: called by every path that copies tensor bytes.
void count_copied_bytes(uint64_t n);

}  // namespace grouplin::detail
