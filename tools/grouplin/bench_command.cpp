// grouplin bench: the command line of the bench library (bench/bench.hpp), which does the work.
#include <memory>

#include "bench/bench.hpp"
#include "cli/commands.hpp"

namespace grouplin::cli {

using bench::BenchConfig;
using bench::kAllDTypeNames;
using bench::kOpNames;
using bench::kRoutingNames;
using bench::kShapeNames;

void add_bench_command(CLI::App& app) {
  auto c = std::make_shared<BenchConfig>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Measure the grouped GEMM against one dense GEMM, a per-expert loop and a memory copy");
  cmd->add_option("--shapes", c->shapes, "MoE shapes (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(kShapeNames));
  cmd->add_option("--rows", c->rows, "total rows T (default: 16,256,4096,16384)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--routing", c->routings, "routings (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(kRoutingNames));
  cmd->add_option("--ops", c->ops, "operations (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(kOpNames));
  cmd->add_option("--dtype", c->dtypes, "params dtypes (default: both)")
      ->delimiter(',')
      ->check(CLI::IsMember(kAllDTypeNames));
  cmd->add_option("--fp8-rows", c->fp8_rows,
                  "rows per expert of the --dtype fp8 cases (default: 1,2,4,16)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--reps", c->reps, "interleaved repetitions, best time kept (default: 2)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--threads", c->threads,
                  "threads for GroupLin and OpenBLAS (default: hardware threads)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--plot-data", c->plot_data, "also write the GF/s table to this file (gnuplot)");
  cmd->add_flag("--json", c->json, "print JSON");
  cmd->add_flag("--quick", c->quick, "a seconds-long smoke run (small shapes, few cases)");
  cmd->add_flag("--full-size", c->full_size, "the full REFERENCE shapes (long)");
  cmd->add_flag("--pack-weights", c->pack_weights,
                "BF16 forward reads weights packed once beforehand (weight packing, for "
                "inference; only where the kernels take BF16 pairs)");
  cmd->footer(
      "Every case runs GroupLin, one dense GEMM of the same FLOPs, a per-expert loop and a copy\n"
      "of the bytes, interleaved in one process; GROUPLIN_ISA=avx2|avx512|avx512bf16|amx caps the\n"
      "kernels. --dtype fp8 adds FP8 weights (128x128 block scales) against the same BF16\n"
      "weights and a copy of their bytes, at 1, 2, 4 and 16 rows per expert (--fp8-rows; --rows\n"
      "does not apply), forward and dgrad; its goals are also counted over the cases whose BF16\n"
      "weights do not fit in the L3 cache (the memory-bound ones). docs/PERFORMANCE.md gives the\n"
      "published runs and how to reproduce them.\n\n"
      "Examples:\n"
      "  grouplin bench --quick\n"
      "  grouplin bench --shapes qwen3,mixtral --rows 4096 --ops forward,dgrad --reps 5\n"
      "  GROUPLIN_ISA=avx2 grouplin bench --json > avx2.json\n"
      "  grouplin bench --dtype fp8 --shapes qwen3,deepseek --reps 5");
  cmd->callback([c, cmd] {
    c->rows_given = cmd->count("--rows") > 0;
    c->routings_given = cmd->count("--routing") > 0;
    c->reps_given = cmd->count("--reps") > 0;
    c->fp8_rows_given = cmd->count("--fp8-rows") > 0;
    bench::run_bench(*c);
  });
}

}  // namespace grouplin::cli
