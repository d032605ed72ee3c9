// A GroupedLinear's forward weights packed for the pair kernels (kernels/packed_weights.hpp),
// kept from call to call and repacked, expert by expert, only when a weight's bytes may have
// changed: its storage's generation (Storage::generation) or its address differs from the one
// it was packed from.
//
//   PackedWeightCache cache;
//   std::vector<const std::byte*> packed = cache.refresh(weights, x.dtype());  // maybe empty
//   kernels::grouped_forward(x, m_splits, weights, {}, biases, y, packed);
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "grouplin/tensor.hpp"
#include "kernels/packed_weights.hpp"

namespace grouplin {

class PackedWeightCache {
 public:
  // What grouped_forward takes for these weights (all [out, in], one dtype) beside x of dtype
  // `x`: empty when the kernels would not read packed weights (dtypes, kernel set), else one
  // pointer per expert, up to date. Allocates once (one block for all experts), the first time.
  std::vector<const std::byte*> refresh(std::span<const Tensor> weights, DType x);
  // Bytes held.
  size_t bytes() const { return block_.bytes(); }
  // Frees them.
  void clear();

 private:
  struct Source {
    const std::byte* data = nullptr;
    uint64_t generation = 0;
  };
  kernels::PackedForwardBlock block_;
  std::vector<Source> packed_from_;  // per expert; data null: not packed
};

}  // namespace grouplin
