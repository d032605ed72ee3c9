#include "kernels/packed_weights.hpp"

#include "kernels/micro_kernels.hpp"
#include "kernels/packing.hpp"
#include "kernels/thread_pool.hpp"

namespace grouplin::kernels {

bool forward_weights_packable(DType weights, DType x) {
  return weights == DType::BF16 && x == DType::BF16 && micro_kernels().pair_tile != nullptr;
}

size_t packed_forward_bytes(int64_t out, int64_t in) {
  const int64_t strips = (out + kOuterCols - 1) / kOuterCols;
  return static_cast<size_t>(strips * pair_panel_dwords(in)) * sizeof(uint32_t);
}

void pack_forward_weights(std::span<const Tensor> weights, std::span<std::byte* const> dst) {
  // One task per expert: packing is a copy with shuffles, memory-bound, so finer tasks gain
  // nothing.
  run_tasks(weights.size(), workers_for(weights.size()), [&](size_t e, int) {
    const Tensor& w = weights[e];
    const MatrixRef m{w.data(), w.dtype(), w.dim(1)};
    pack_pairs_transposed(m, 0, w.dim(1), 0, w.dim(0), reinterpret_cast<uint32_t*>(dst[e]));
  });
}

namespace {

size_t aligned_stride(int64_t out, int64_t in) {
  return (packed_forward_bytes(out, in) + kStorageAlignment - 1) / kStorageAlignment *
         kStorageAlignment;
}

}  // namespace

PackedForwardBlock::PackedForwardBlock(size_t n, int64_t out, int64_t in)
    : storage_(Storage::allocate(aligned_stride(out, in) * n)),
      stride_(aligned_stride(out, in)),
      n_(n) {}

PackedForwardBlock PackedForwardBlock::pack(std::span<const Tensor> weights) {
  if (weights.empty()) return {};
  PackedForwardBlock block(weights.size(), weights[0].dim(0), weights[0].dim(1));
  std::vector<std::byte*> dst(weights.size());
  for (size_t e = 0; e < weights.size(); ++e) dst[e] = block.expert(e);
  pack_forward_weights(weights, dst);
  return block;
}

std::vector<const std::byte*> PackedForwardBlock::pointers() const {
  std::vector<const std::byte*> p(n_);
  for (size_t e = 0; e < n_; ++e) p[e] = expert(e);
  return p;
}

bool PackedForwardBlock::fits(size_t n, int64_t out, int64_t in) const {
  return storage_ != nullptr && n_ == n && stride_ == aligned_stride(out, in);
}

}  // namespace grouplin::kernels
