#include "nn/packed_weight_cache.hpp"

#include "kernels/packed_weights.hpp"

namespace grouplin {

std::vector<const std::byte*> PackedWeightCache::refresh(std::span<const Tensor> weights, DType x) {
  if (weights.empty() || !kernels::forward_weights_packable(weights[0].dtype(), x)) return {};
  const int64_t out = weights[0].dim(0), in = weights[0].dim(1);
  if (!block_.fits(weights.size(), out, in)) {
    block_ = kernels::PackedForwardBlock(weights.size(), out, in);
    packed_from_.assign(weights.size(), Source{});
  }
  std::vector<Source> now(weights.size());
  std::vector<Tensor> stale;
  std::vector<std::byte*> into;
  for (size_t e = 0; e < weights.size(); ++e) {
    now[e] = {weights[e].data(), weights[e].storage()->generation()};
    if (packed_from_[e].data == now[e].data && packed_from_[e].generation == now[e].generation) {
      continue;
    }
    stale.push_back(weights[e]);
    into.push_back(block_.expert(e));
    packed_from_[e] = Source{};  // until packed: a failure below leaves it stale
  }
  if (!stale.empty()) kernels::pack_forward_weights(stale, into);
  packed_from_ = std::move(now);
  return block_.pointers();
}

void PackedWeightCache::clear() {
  block_ = {};
  packed_from_.clear();
}

}  // namespace grouplin
