// Deterministic parameter initialisation: each value is a pure function of (seed, stream,
// index), so every layout that holds the same expert gets the same bits.
#pragma once

#include <cstdint>

#include "grouplin/tensor.hpp"

namespace grouplin {

// Fills t (F32 or BF16) with values uniform in [-bound, bound) drawn from (seed, stream).
void init_uniform(Tensor t, uint64_t seed, int64_t stream, float bound);

}  // namespace grouplin
