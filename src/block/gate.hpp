// Private: the gate of the expert block (grouplin/expert_block.hpp) over whole rows, forward and
// backward, in F32 or BF16 activations. Pure element-wise math: each output element depends on
// its own row's inputs alone, so the rows may run on any thread in any order.
#pragma once

#include <cstdint>

#include "grouplin/expert_block.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin::block {

// Columns of the gate's output (I) for a first projection of `first_out` columns.
int64_t gate_width(const ExpertGate& gate, int64_t first_out);

// a [R, I] = gate(h [R, first_out]); a and h of one dtype (F32 or BF16). BF16 results are rounded
// after each step where PyTorch rounds a BF16 tensor (expert_block.hpp).
void gate_forward(const ExpertGate& gate, const Tensor& h, Tensor& a);

// dh [R, first_out] for da [R, I] (dh, da and h of one dtype), in F32, rounded once.
void gate_backward(const ExpertGate& gate, const Tensor& h, const Tensor& da, Tensor& dh);

}  // namespace grouplin::block
