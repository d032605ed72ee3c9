// Forward weights packed once for many calls: BF16 expert weights laid out as the pair kernels
// (AVX512-BF16, AMX) read them, so that a forward reads them as they are instead of packing each
// tile's slice again on every call (on a Zen 4, 32 rows per expert, packing was a fifth of the
// forward's time). GroupedLinear keeps them (nn/packed_weight_cache.hpp) and hands them to
// grouped_forward.
//
//   if (kernels::forward_weights_packable(w.dtype(), x.dtype())) {
//     const kernels::PackedForwardBlock block = kernels::PackedForwardBlock::pack(weights);
//     kernels::grouped_forward(x, m_splits, weights, {}, biases, y, block.pointers());
//   }
//
// Layout of one packed [out, in] weight: ceil(out / 16) strips of 16 output features, strip s
// the pair panel (packing.hpp) of rows 16s.. for all of `in` (pair_panel_dwords(in) dwords).
// Any depth block the kernels take (a multiple of 2 * kPairGroup from the start) is a window of
// it with the same dwords as that block packed alone, so packed and unpacked give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "grouplin/storage.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin::kernels {

// Whether forward on the current kernel set reads weights of dtype `weights` beside x of dtype
// `x` as pair panels (both BF16, a set with pair kernels): then packing them ahead pays.
bool forward_weights_packable(DType weights, DType x);

// Bytes of one packed [out, in] weight.
size_t packed_forward_bytes(int64_t out, int64_t in);

// Packs each weights[i] (BF16 [out, in], one shape for all) into dst[i] (packed_forward_bytes of
// it, 4-byte aligned), the experts spread over the kernels' threads.
void pack_forward_weights(std::span<const Tensor> weights, std::span<std::byte* const> dst);

// Room for n packed [out, in] weights in one allocation, each starting 64-byte aligned (as the
// kernels' own scratch panels do, so a strip never straddles more cache lines than it must).
class PackedForwardBlock {
 public:
  PackedForwardBlock() = default;
  PackedForwardBlock(size_t n, int64_t out, int64_t in);
  // The n weights packed into a new block (all [out, in], one shape).
  static PackedForwardBlock pack(std::span<const Tensor> weights);

  // Where expert e's packed weight starts, e < n.
  std::byte* expert(size_t e) const { return storage_->mutable_data() + e * stride_; }
  // Every expert's start, as grouped_forward takes them.
  std::vector<const std::byte*> pointers() const;
  // Whether it holds n weights of this shape.
  bool fits(size_t n, int64_t out, int64_t in) const;
  // Bytes held (0 when empty).
  size_t bytes() const { return storage_ ? storage_->size() : 0; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t stride_ = 0;
  size_t n_ = 0;
};

}  // namespace grouplin::kernels
