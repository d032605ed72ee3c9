#include "nn/packed_weight_cache.hpp"

#include "kernels/packed_weights.hpp"

namespace grouplin {

std::vector<const std::byte*> PackedWeightCache::refresh(std::span<const Tensor> weights, DType x) {
  if (weights.empty() || !kernels::forward_weights_packable(weights[0].dtype(), x)) return {};
  const size_t per_expert = kernels::packed_forward_bytes(weights[0].dim(0), weights[0].dim(1));
  // Strips start 64-byte aligned, as the kernels' own scratch panels do.
  const size_t stride =
      (per_expert + kStorageAlignment - 1) / kStorageAlignment * kStorageAlignment;
  if (!block_ || per_expert_ != stride || packed_from_.size() != weights.size()) {
    block_ = Storage::allocate(stride * weights.size());
    per_expert_ = stride;
    packed_from_.assign(weights.size(), Source{});
  }
  std::vector<Source> now(weights.size());
  std::vector<Tensor> stale;
  std::vector<std::byte*> into;
  std::vector<const std::byte*> packed(weights.size());
  std::byte* base = block_->mutable_data();
  for (size_t e = 0; e < weights.size(); ++e) {
    packed[e] = base + e * stride;
    now[e] = {weights[e].data(), weights[e].storage()->generation()};
    if (packed_from_[e].data == now[e].data && packed_from_[e].generation == now[e].generation) {
      continue;
    }
    stale.push_back(weights[e]);
    into.push_back(base + e * stride);
    packed_from_[e] = Source{};  // until packed: a failure below leaves it stale
  }
  if (!stale.empty()) kernels::pack_forward_weights(stale, into);
  packed_from_ = std::move(now);
  return packed;
}

void PackedWeightCache::clear() {
  block_.reset();
  per_expert_ = 0;
  packed_from_.clear();
}

}  // namespace grouplin
