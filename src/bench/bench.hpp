// `grouplin bench` as a library above GroupLin's layers (it times the kernels through their
// private headers): the command line parses its options into a BenchConfig and calls run_bench,
// which prints a table (or JSON) of every case, measured side by side in one run.
//
//   grouplin::bench::BenchConfig c;
//   c.quick = true;
//   grouplin::bench::run_bench(c);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace grouplin::bench {

inline const std::vector<std::string> kShapeNames = {"mixtral", "qwen3", "olmoe", "deepseek",
                                                     "gptoss"};
inline const std::vector<std::string> kRoutingNames = {"uniform", "skewed", "empty25", "one"};
inline const std::vector<std::string> kOpNames = {"forward", "dgrad", "wgrad", "bgrad"};
inline const std::vector<std::string> kDTypeNames = {"f32", "bf16"};  // the default
// fp8: the FP8-weight cases of bench_fp8.hpp, with these rows per expert (quick: 1 and 4).
inline const std::vector<std::string> kAllDTypeNames = {"f32", "bf16", "fp8"};
inline const std::vector<int64_t> kFp8RowsPerExpert = {1, 2, 4, 16};

struct BenchConfig {
  std::vector<std::string> shapes = kShapeNames;
  std::vector<int64_t> rows = {16, 256, 4096, 16384};
  std::vector<std::string> routings = kRoutingNames;
  std::vector<std::string> ops = kOpNames;
  std::vector<std::string> dtypes = kDTypeNames;
  std::vector<int64_t> fp8_rows = kFp8RowsPerExpert;
  int reps = 2;
  int threads = 0;  // 0: GroupLin's default
  bool json = false;
  bool quick = false;
  bool full_size = false;
  bool pack_weights = false;
  std::string plot_data;
  bool rows_given = false, routings_given = false, reps_given = false, fp8_rows_given = false;
};

// Runs the cases `c` selects (its *_given flags: whether the user set the field, which --quick
// then keeps) and prints the results. Throws grouplin::Error for what the library refuses.
void run_bench(BenchConfig c);

}  // namespace grouplin::bench
