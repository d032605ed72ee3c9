// The expert block's routing (routing.hpp): one pass counts, one pass places.
#include "block/routing.hpp"

#include <string>

#include "grouplin/error.hpp"

namespace grouplin::block {
namespace {

template <class Id>
Routing route_ids(const Id* ids, int64_t tokens, int64_t top_k, int64_t experts) {
  Routing r;
  r.tokens = tokens;
  r.top_k = top_k;
  r.m_splits.assign(static_cast<size_t>(experts), 0);
  const int64_t slots = tokens * top_k;
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t e = static_cast<int64_t>(ids[s]);
    if (e < 0) {
      throw Error(ErrorCode::InvalidArgument,
                  "expert_block_forward: top_k_index[" + std::to_string(s / top_k) + ", " +
                      std::to_string(s % top_k) + "] is " + std::to_string(e) +
                      ", expected an expert id >= 0 (ids >= E are skipped)");
    }
    if (e < experts) ++r.m_splits[static_cast<size_t>(e)];
  }
  std::vector<int64_t> next(static_cast<size_t>(experts), 0);
  int64_t routed = 0;
  for (int64_t e = 0; e < experts; ++e) {
    next[static_cast<size_t>(e)] = routed;
    routed += r.m_splits[static_cast<size_t>(e)];
  }
  r.slot_of_row.resize(static_cast<size_t>(routed));
  r.row_of_slot.assign(static_cast<size_t>(slots), -1);
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t e = static_cast<int64_t>(ids[s]);
    if (e >= experts) continue;
    const int64_t row = next[static_cast<size_t>(e)]++;
    r.slot_of_row[static_cast<size_t>(row)] = s;
    r.row_of_slot[static_cast<size_t>(s)] = row;
  }
  return r;
}

}  // namespace

Routing route(const Tensor& top_k_index, int64_t experts) {
  const int64_t tokens = top_k_index.dim(0), top_k = top_k_index.dim(1);
  if (top_k_index.dtype() == DType::I32) {
    return route_ids(top_k_index.data_as<int32_t>(), tokens, top_k, experts);
  }
  return route_ids(top_k_index.data_as<int64_t>(), tokens, top_k, experts);
}

Routing route_from_rows(int64_t tokens, int64_t top_k, std::vector<int64_t> m_splits,
                        std::vector<int64_t> row_of_slot) {
  Routing r;
  r.tokens = tokens;
  r.top_k = top_k;
  int64_t routed = 0;
  for (int64_t m : m_splits) routed += m;
  r.m_splits = std::move(m_splits);
  r.row_of_slot = std::move(row_of_slot);
  r.slot_of_row.assign(static_cast<size_t>(routed), -1);
  for (size_t s = 0; s < r.row_of_slot.size(); ++s) {
    const int64_t row = r.row_of_slot[s];
    if (row >= 0 && row < routed) r.slot_of_row[static_cast<size_t>(row)] = static_cast<int64_t>(s);
  }
  return r;
}

}  // namespace grouplin::block
