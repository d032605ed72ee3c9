// Forward weights packed once for many calls: BF16 expert weights laid out as the pair kernels
// (AVX512-BF16, AMX) read them, so that a forward reads them as they are instead of packing each
// tile's slice again on every call (on a Zen 4, 32 rows per expert, packing was a fifth of the
// forward's time). GroupedLinear keeps them (nn/packed_weight_cache.hpp) and hands them to
// grouped_forward.
//
//   if (kernels::forward_weights_packable(w.dtype(), x.dtype())) {
//     std::vector<std::byte*> dst = ...;   // packed_forward_bytes(out, in) each, 64-byte aligned
//     kernels::pack_forward_weights(weights, dst);
//     kernels::grouped_forward(x, m_splits, weights, {}, biases, y, packed);
//   }
//
// Layout of one packed [out, in] weight: ceil(out / 16) strips of 16 output features, strip s
// the pair panel (packing.hpp) of rows 16s.. for all of `in` (pair_panel_dwords(in) dwords).
// Any depth block the kernels take (a multiple of 2 * kPairGroup from the start) is a window of
// it with the same dwords as that block packed alone, so packed and unpacked give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

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

}  // namespace grouplin::kernels
