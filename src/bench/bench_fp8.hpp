// grouplin bench --dtype fp8: the grouped GEMM on FP8 weights (F8_E4M3 codes with 128 x 128 F32
// block scales, decoded as the kernels read them) against the same case on BF16 weights and
// against a copy of the FP8 weights' bytes, side by side in one run; BF16 activations, the
// weights of a Single-layout GroupedLinear. Few rows per expert is the memory-bound decode case
// FP8 weights are for: half the bytes of BF16 to stream.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace grouplin::bench {

struct Fp8Shape {
  std::string name;
  int64_t experts = 0, in = 0, out = 0;
};

// Runs forward and dgrad (those of `ops`) for every shape and rows-per-expert count (uniform
// routing), `reps` interleaved repetitions each; prints a table unless `json`. Returns the results
// and the goals as JSON ({"results": [...], "goals": [...]}).
nlohmann::json run_fp8_bench(const std::vector<Fp8Shape>& shapes,
                             const std::vector<int64_t>& rows_per_expert,
                             const std::vector<std::string>& ops, int reps, bool json);

}  // namespace grouplin::bench
