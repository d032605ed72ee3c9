// Private: the routing of the expert block (grouplin/expert_block.hpp): slots (t, k) sorted by
// expert with a stable counting sort, so that each expert's rows keep token order and the order
// depends on the ids alone.
#pragma once

#include <cstdint>
#include <vector>

#include "grouplin/tensor.hpp"

namespace grouplin::block {

struct Routing {
  int64_t tokens = 0, top_k = 0;
  std::vector<int64_t> m_splits;     // [E]: routed rows per expert
  std::vector<int64_t> slot_of_row;  // [R]: the slot t * K + k of each routed row
  std::vector<int64_t> row_of_slot;  // [T * K]: the routed row of each slot, or -1 (id >= E)
  int64_t rows() const { return static_cast<int64_t>(slot_of_row.size()); }
};

// Routing of top_k_index [T, K] (I64 or I32) over `experts` experts. Throws
// Error(InvalidArgument) for a negative id, naming its slot; the caller has checked the shape.
Routing route(const Tensor& top_k_index, int64_t experts);

// The same routing rebuilt from what a forward saved (row_of_slot, m_splits).
Routing route_from_rows(int64_t tokens, int64_t top_k, std::vector<int64_t> m_splits,
                        std::vector<int64_t> row_of_slot);

}  // namespace grouplin::block
