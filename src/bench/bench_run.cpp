// grouplin bench (bench/bench.hpp): GroupLin's grouped GEMM (forward, dgrad, wgrad, bgrad; F32 and
// BF16 params) against one dense OpenBLAS sgemm of the same total work, the plain per-expert
// OpenBLAS loop and a memory copy, all measured side by side in one run: every repetition runs each
// variant once, in turn, and each variant keeps its best time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.hpp"
#include "bench/bench_baselines.hpp"
#include "bench/bench_fp8.hpp"
#include "bench/bench_timing.hpp"
#include "grouplin/grouplin.hpp"
#include "kernels/grouped_gemm.hpp"
#include "kernels/isa.hpp"
#include "kernels/micro_kernels.hpp"
#include "kernels/packed_weights.hpp"
#include "kernels/thread_pool.hpp"

namespace grouplin::bench {
namespace {

// MoE shapes of REFERENCE.md §D (fc1: in = hidden, out = expert ffn). The default run scales
// them down to finish in minutes; --full-size uses the sizes in the comments.
struct BenchShape {
  const char* name;
  int64_t experts, in, out;
  bool bias;
};
constexpr BenchShape kDefaultShapes[] = {
    {"mixtral", 8, 1024, 896, false},    // full size: 8 x 4096 x 3584 (ffn 14336 / 4)
    {"qwen3", 128, 1024, 384, false},    // full size: 128 x 2048 x 768
    {"olmoe", 64, 1024, 512, false},     // full size: 64 x 2048 x 1024
    {"deepseek", 32, 1792, 512, false},  // full size: 32 x 7168 x 2048 (256 experts / 8)
    {"gptoss", 32, 960, 960, true},      // full size: 32 x 2880 x 2880 (128 experts / 4), bias
};
constexpr BenchShape kFullShapes[] = {
    {"mixtral", 8, 4096, 3584, false}, {"qwen3", 128, 2048, 768, false},
    {"olmoe", 64, 2048, 1024, false},  {"deepseek", 32, 7168, 2048, false},
    {"gptoss", 32, 2880, 2880, true},
};

// Mean rows per active expert below which a case counts as memory-bound: the weights (or weight
// gradients) then carry fewer than 8 flops per F32 byte, about this machine's flops-to-bandwidth
// balance (~200 GF/s over ~25 GB/s).
constexpr double kMemoryBoundRows = 16.0;

// All tensors of one shape, F32 and BF16, sized for the largest row count.
struct ShapeData {
  Tensor w[2], b[2], x[2], dy[2], y[2], dx[2], dw[2], db[2], copy_dst;
  std::vector<Tensor> we[2], be[2], dwe[2], dbe[2];

  ShapeData(const BenchShape& s, int64_t max_rows) {
    const Tensor w32 = filled({s.experts, s.out, s.in}, 1), b32 = filled({s.experts, s.out}, 2);
    const Tensor x32 = filled({max_rows, s.in}, 3), dy32 = filled({max_rows, s.out}, 4);
    for (int d = 0; d < 2; ++d) {
      const DType dt = d == 0 ? DType::F32 : DType::BF16;
      w[d] = w32.to(dt);
      b[d] = b32.to(dt);
      x[d] = x32.to(dt);
      dy[d] = dy32.to(dt);
      y[d] = Tensor::zeros({max_rows, s.out}, dt);
      dx[d] = Tensor::zeros({max_rows, s.in}, dt);
      dw[d] = Tensor::zeros({s.experts, s.out, s.in}, dt);
      db[d] = Tensor::zeros({s.experts, s.out}, dt);
      we[d] = experts_of(w[d]);
      be[d] = experts_of(b[d]);
      dwe[d] = experts_of(dw[d]);
      dbe[d] = experts_of(db[d]);
    }
    copy_dst = Tensor::zeros({s.experts, s.out, s.in}, DType::F32);
  }

  // --pack-weights: the BF16 weights packed once for forward, as GroupedLinear keeps them with
  // weight packing on (nothing where the kernels would not read them).
  kernels::PackedForwardBlock packed_block;
  std::vector<const std::byte*> packed;
  void pack_forward_weights() {
    if (we[1].empty() || !kernels::forward_weights_packable(DType::BF16, DType::BF16)) return;
    packed_block = kernels::PackedForwardBlock::pack(we[1]);
    packed = packed_block.pointers();
  }
};

double gflops(double flops, double s) { return s == kNotRun ? 0.0 : flops / s * 1e-9; }
double gbytes(double bytes, double s) { return s == kNotRun ? 0.0 : bytes / s * 1e-9; }
double ratio(double a_s, double b_s) { return a_s == kNotRun || b_s == kNotRun ? 0.0 : b_s / a_s; }

// Each path's peak: cores x clock x FLOP per core and cycle (REFERENCE.md §H), from the kernel
// set's instruction widths: 32 F32 FLOP with AVX2+FMA (two 256-bit FMA units), 64 with AVX-512
// (two 512-bit FMA units), BF16 the same where the set widens it to F32, 128 with vdpbf16ps (two
// products per 32-bit lane, two units) and 1024 with AMX-BF16. AMD Zen 4 runs 512-bit arithmetic
// as two 256-bit halves on the AVX2 units: 32 F32 FLOP with AVX-512 too, 64 with vdpbf16ps. Cores:
// the GroupLin threads; clock: measured with every GroupLin thread busy (measured_clock_ghz), or,
// where it cannot be, the first "cpu MHz" of /proc/cpuinfo (under a VM often the nominal clock,
// not the boost one). Zero where unknown (the portable set, or no clock).
struct Peak {
  int cores = 0;
  double clock_ghz = 0;
  const char* clock_source = "unknown";
  int f32_flop_per_cycle = 0, bf16_flop_per_cycle = 0;
  double gflops(int dt) const {
    return cores * clock_ghz * (dt == 0 ? f32_flop_per_cycle : bf16_flop_per_cycle);
  }
  std::string describe(int dt) const {
    if (gflops(dt) <= 0) return "unknown";
    char text[160];
    std::snprintf(text, sizeof text, "%.0f GF/s (%d cores x %.2f GHz x %d FLOP/cycle)", gflops(dt),
                  cores, clock_ghz, dt == 0 ? f32_flop_per_cycle : bf16_flop_per_cycle);
    return text;
  }
};

double reported_clock_ghz() {
  const std::string mhz = cpuinfo_field("cpu MHz");
  return mhz.empty() ? 0.0 : std::atof(mhz.c_str()) / 1000.0;
}

Peak machine_peak() {
  Peak p;
  p.cores = kernels::num_threads();
  p.clock_ghz = measured_clock_ghz(p.cores);
  p.clock_source = "measured: dependent adds on every thread";
  if (p.clock_ghz <= 0) {
    p.clock_ghz = reported_clock_ghz();
    p.clock_source = "/proc/cpuinfo cpu MHz (reported, not measured)";
  }
  const kernels::MicroKernels& mk = kernels::micro_kernels();
  const std::string name = mk.name;
  const int zmm = kernels::detect_cpu().zmm_halves ? 32 : 64;
  p.f32_flop_per_cycle = name == "portable" ? 0 : name == "avx2+fma" ? 32 : zmm;
  p.bf16_flop_per_cycle = name == "amx-bf16"     ? 1024
                          : name == "avx512bf16" ? 2 * zmm
                                                 : p.f32_flop_per_cycle;
  return p;
}

struct CaseResult {
  std::string shape, routing, op;
  int64_t experts = 0, in = 0, out = 0, rows = 0, active = 0;
  double flops = 0;
  bool memory_bound = false;
  double dense_s = kNotRun;
  double loop_s[2] = {kNotRun, kNotRun};
  double grouplin_s[2] = {kNotRun, kNotRun};
  double copy_s[2] = {kNotRun, kNotRun};
  double traffic_bytes[2] = {0, 0};  // weights, gradients (wgrad), or dy and db (bgrad) streamed
  double copy_bytes[2] = {0, 0};     // what the copy variant copied

  double peak_gflops[2] = {0, 0};  // the path's peak (Peak), 0 where unknown

  double vs_peak(int dt) const {
    return peak_gflops[dt] > 0 ? gflops(flops, grouplin_s[dt]) / peak_gflops[dt] : 0.0;
  }
  double copy_gbytes(int dt) const { return gbytes(copy_bytes[dt], copy_s[dt]); }
  double grouplin_gbytes(int dt) const { return gbytes(traffic_bytes[dt], grouplin_s[dt]); }
  double vs_copy(int dt) const {
    return copy_gbytes(dt) > 0 ? grouplin_gbytes(dt) / copy_gbytes(dt) : 0.0;
  }
};

CaseResult run_case(const BenchShape& s, ShapeData& d, int64_t rows, const std::string& routing,
                    const std::string& op, const BenchConfig& c, const Peak& peak) {
  CaseResult r{s.name, routing, op, s.experts, s.in, s.out, rows};
  const std::vector<int64_t> splits = make_splits(routing, s.experts, rows);
  r.active = std::count_if(splits.begin(), splits.end(), [](int64_t m) { return m > 0; });
  const double k_n = static_cast<double>(s.in) * static_cast<double>(s.out);
  r.flops = op == "bgrad" ? static_cast<double>(rows) * static_cast<double>(s.out)
                          : 2.0 * static_cast<double>(rows) * k_n;
  for (int dt = 0; dt < 2; ++dt) r.peak_gflops[dt] = r.op == "bgrad" ? 0.0 : peak.gflops(dt);
  const bool f32 = std::find(c.dtypes.begin(), c.dtypes.end(), "f32") != c.dtypes.end();
  const bool bf16 = std::find(c.dtypes.begin(), c.dtypes.end(), "bf16") != c.dtypes.end();
  // Bytes that must stream: the active experts' weights (forward, dgrad), every expert's weight
  // gradient (wgrad), the rows of dy and every expert's bias gradient (bgrad).
  for (int dt = 0; dt < 2; ++dt) {
    const double elem = dt == 0 ? 4.0 : 2.0;
    const double out = static_cast<double>(s.out);
    r.traffic_bytes[dt] =
        op == "bgrad"   ? elem * (static_cast<double>(rows) + static_cast<double>(s.experts)) * out
        : op == "wgrad" ? elem * k_n * static_cast<double>(s.experts)
                        : elem * k_n * static_cast<double>(r.active);
  }
  const double rows_per_expert =
      static_cast<double>(rows) / static_cast<double>(op == "wgrad" ? s.experts : r.active);
  r.memory_bound = op == "bgrad" || rows_per_expert < kMemoryBoundRows;

  std::vector<Variant> variants;
  Tensor x[2], dy[2], y[2], dx[2];
  for (int dt = 0; dt < 2; ++dt) {
    x[dt] = d.x[dt].rows(0, rows);
    dy[dt] = d.dy[dt].rows(0, rows);
    y[dt] = d.y[dt].rows(0, rows);
    dx[dt] = d.dx[dt].rows(0, rows);
  }
  std::span<const Tensor> no_bias;
  if (op != "bgrad" && bench::blas_available()) {
    Tensor dw0 = d.dwe[0][0];
    variants.push_back({&r.dense_s,
                        [&, dw0]() mutable {
                          if (op == "forward") bench::dense_forward(x[0], d.we[0][0], y[0]);
                          if (op == "dgrad") bench::dense_dgrad(dy[0], d.we[0][0], dx[0]);
                          if (op == "wgrad") bench::dense_wgrad(x[0], dy[0], dw0);
                        },
                        true});
  }
  for (int dt = 0; dt < 2; ++dt) {
    if ((dt == 0 && !f32) || (dt == 1 && !bf16)) continue;
    std::span<const Tensor> biases = s.bias ? std::span<const Tensor>(d.be[dt]) : no_bias;
    if (bench::blas_available()) {
      variants.push_back({&r.loop_s[dt],
                          [&, dt, biases] {
                            if (op == "forward")
                              bench::loop_forward(x[dt], splits, d.we[dt], biases, y[dt]);
                            if (op == "dgrad") bench::loop_dgrad(dy[dt], splits, d.we[dt], dx[dt]);
                            if (op == "wgrad") bench::loop_wgrad(x[dt], dy[dt], splits, d.dwe[dt]);
                            if (op == "bgrad") bench::loop_bgrad(dy[dt], splits, d.dbe[dt]);
                          },
                          true});
    }
    variants.push_back({&r.grouplin_s[dt],
                        [&, dt, biases] {
                          if (op == "forward")
                            kernels::grouped_forward(
                                x[dt], splits, d.we[dt], {}, biases, y[dt],
                                dt == 1 ? d.packed : std::vector<const std::byte*>{});
                          if (op == "dgrad")
                            kernels::grouped_dgrad(dy[dt], splits, d.we[dt], {}, dx[dt]);
                          if (op == "wgrad")
                            kernels::grouped_wgrad(x[dt], dy[dt], splits, d.dwe[dt], false);
                          if (op == "bgrad") kernels::grouped_bgrad(dy[dt], splits, d.dbe[dt]);
                        },
                        false});
    if (r.memory_bound) {
      const size_t bytes = std::min(static_cast<size_t>(r.traffic_bytes[dt]), d.copy_dst.nbytes());
      r.copy_bytes[dt] = static_cast<double>(bytes);
      variants.push_back(
          {&r.copy_s[dt],
           [&d, bytes] { bench::parallel_copy(d.w[0].data(), d.copy_dst.mutable_data(), bytes); },
           false});
    }
  }
  bench::time_variants(variants, c.reps);
  return r;
}

nlohmann::json to_json(const CaseResult& r) {
  nlohmann::json j = {
      {"shape", r.shape},
      {"experts", r.experts},
      {"in", r.in},
      {"out", r.out},
      {"rows", r.rows},
      {"routing", r.routing},
      {"op", r.op},
      {"active_experts", r.active},
      {"rows_per_expert", static_cast<double>(r.rows) / static_cast<double>(r.experts)},
      {"m_splits", make_splits(r.routing, r.experts, r.rows)},  // for peers (bench/torch_peers.py)
      {"memory_bound", r.memory_bound}};
  if (r.dense_s != kNotRun) j["dense_gflops"] = gflops(r.flops, r.dense_s);
  for (int dt = 0; dt < 2; ++dt) {
    if (r.grouplin_s[dt] == kNotRun) continue;
    nlohmann::json v = {{"grouplin_gflops", gflops(r.flops, r.grouplin_s[dt])},
                        {"loop_gflops", gflops(r.flops, r.loop_s[dt])},
                        {"vs_loop", ratio(r.grouplin_s[dt], r.loop_s[dt])}};
    if (r.dense_s != kNotRun) v["vs_dense"] = ratio(r.grouplin_s[dt], r.dense_s);
    if (r.peak_gflops[dt] > 0) v["vs_peak"] = r.vs_peak(dt);
    if (r.memory_bound) {
      v["grouplin_gbytes"] = r.grouplin_gbytes(dt);
      v["copy_gbytes"] = r.copy_gbytes(dt);
      v["vs_copy"] = r.vs_copy(dt);
    }
    if (dt == 1 && r.grouplin_s[0] != kNotRun)
      v["vs_f32"] = ratio(r.grouplin_s[1], r.grouplin_s[0]);
    j[dt == 0 ? "f32" : "bf16"] = v;
  }
  return j;
}

void print_header() {
  std::printf("%-8s %6s %-8s %-7s %7s %7s | %-34s | %-40s\n", "shape", "rows", "routing", "op",
              "rows/ex", "dense", "F32 GF/s: loop grplin xdns xloop xpk",
              "BF16 GF/s: loop grplin xdns xloop xpk xf32");
}

void print_row(const CaseResult& r) {
  std::printf("%-8s %6lld %-8s %-7s %7.2f %7.1f |", r.shape.c_str(), static_cast<long long>(r.rows),
              r.routing.c_str(), r.op.c_str(),
              static_cast<double>(r.rows) / static_cast<double>(r.experts),
              gflops(r.flops, r.dense_s));
  for (int dt = 0; dt < 2; ++dt) {
    std::printf(" %6.1f %6.1f %4.2f %5.2f %4.2f", gflops(r.flops, r.loop_s[dt]),
                gflops(r.flops, r.grouplin_s[dt]), ratio(r.grouplin_s[dt], r.dense_s),
                ratio(r.grouplin_s[dt], r.loop_s[dt]), r.vs_peak(dt));
    if (dt == 1) std::printf(" %4.2f", ratio(r.grouplin_s[1], r.grouplin_s[0]));
    std::printf(" |");
  }
  if (r.memory_bound) {
    std::printf(" mem GB/s f32 %.1f (copy %.1f, x%.2f) bf16 %.1f (copy %.1f, x%.2f)",
                r.grouplin_gbytes(0), r.copy_gbytes(0), r.vs_copy(0), r.grouplin_gbytes(1),
                r.copy_gbytes(1), r.vs_copy(1));
  }
  std::printf("\n");
  std::fflush(stdout);
}

// The goals of issue 6.
using bench::Goal;

// The name of a case and dtype in the goals' lines.
std::string case_name(const CaseResult& r, const char* dtype) {
  return r.shape + " rows " + std::to_string(r.rows) + " " + r.routing + " " + r.op + " " + dtype;
}

std::vector<Goal> evaluate(const std::vector<CaseResult>& results) {
  std::vector<Goal> goals = {{"forward >= 0.90 x dense (>= 32 rows/expert)", 0.90},
                             {"dgrad, wgrad >= 0.85 x dense (>= 32 rows/expert)", 0.85},
                             {"memory-bound >= 0.80 x copy bandwidth", 0.80},
                             {"BF16 >= 0.80 x F32", 0.80},
                             {"never slower than the loop", 1.00}};
  for (const CaseResult& r : results) {
    const double per_expert = static_cast<double>(r.rows) / static_cast<double>(r.experts);
    for (int dt = 0; dt < 2; ++dt) {
      const char* name = dt == 0 ? "f32" : "bf16";
      if (r.grouplin_s[dt] == kNotRun) continue;
      const bool dense = r.dense_s != kNotRun;
      if (dense && per_expert >= 32 && r.op == "forward")
        goals[0].add(ratio(r.grouplin_s[dt], r.dense_s), case_name(r, name));
      if (dense && per_expert >= 32 && (r.op == "dgrad" || r.op == "wgrad")) {
        goals[1].add(ratio(r.grouplin_s[dt], r.dense_s), case_name(r, name));
      }
      if (r.memory_bound) goals[2].add(r.vs_copy(dt), case_name(r, name));
      if (dt == 1) goals[3].add(ratio(r.grouplin_s[1], r.grouplin_s[0]), case_name(r, name));
      if (r.loop_s[dt] != kNotRun)
        goals[4].add(ratio(r.grouplin_s[dt], r.loop_s[dt]), case_name(r, name));
    }
  }
  return goals;
}

}  // namespace

void run_bench(BenchConfig c) {
  bench::ensure_short_blas_spin();
  if (c.quick) {  // smaller defaults; what was given explicitly stays
    if (!c.rows_given) c.rows = {16, 256};
    if (!c.routings_given) c.routings = {"uniform", "skewed"};
    if (!c.reps_given) c.reps = 1;
  }
  if (c.threads > 0) bench::set_threads(c.threads);
  const std::string machine = machine_description();
  const Peak peak = machine_peak();
  if (!c.json) {
    std::printf("grouplin bench: %s\n", machine.c_str());
    std::printf("peak (xpk = GroupLin's fraction of it; clock %s): F32 %s, BF16 %s\n",
                peak.clock_source, peak.describe(0).c_str(), peak.describe(1).c_str());
    if (!bench::blas_available()) {
      std::printf("dense and loop baselines absent: %s (their columns read 0)\n",
                  bench::blas_description());
    }
    std::printf("\n");
  }
  const auto has = [&](const char* dt) {
    return std::find(c.dtypes.begin(), c.dtypes.end(), dt) != c.dtypes.end();
  };
  const bool floats = has("f32") || has("bf16");
  std::vector<BenchShape> shapes;
  for (const std::string& name : c.shapes) {
    BenchShape s = *std::find_if(std::begin(kDefaultShapes), std::end(kDefaultShapes),
                                 [&](const BenchShape& b) { return name == b.name; });
    if (c.full_size) {
      s = *std::find_if(std::begin(kFullShapes), std::end(kFullShapes),
                        [&](const BenchShape& b) { return name == b.name; });
    }
    if (c.quick) {
      s.in /= 4;
      s.out /= 4;
    }
    shapes.push_back(s);
  }
  std::vector<CaseResult> results;
  if (!c.json && floats) print_header();
  size_t packed_bytes = 0;  // --pack-weights: what the packed BF16 weights take
  for (const BenchShape& s : shapes) {
    if (!floats) break;
    ShapeData data(s, *std::max_element(c.rows.begin(), c.rows.end()));
    if (c.pack_weights) {
      data.pack_forward_weights();
      packed_bytes += data.packed_block.bytes();
    }
    for (int64_t rows : c.rows) {
      for (const std::string& routing : c.routings) {
        for (const std::string& op : c.ops) {
          results.push_back(run_case(s, data, rows, routing, op, c, peak));
          if (!c.json) print_row(results.back());
        }
      }
    }
  }
  const std::vector<Goal> goals = evaluate(results);
  nlohmann::json fp8;
  if (has("fp8")) {
    std::vector<bench::Fp8Shape> fp8_shapes;
    for (const BenchShape& s : shapes) fp8_shapes.push_back({s.name, s.experts, s.in, s.out});
    const std::vector<int64_t> per_expert =
        c.quick && !c.fp8_rows_given ? std::vector<int64_t>{1, 4} : c.fp8_rows;
    fp8 = bench::run_fp8_bench(fp8_shapes, per_expert, c.ops, c.reps, c.json);
  }
  if (c.json) {
    nlohmann::json out = {{"machine", machine},
                          {"kernels", kernels::micro_kernels().name},
                          {"peak",
                           {{"cores", peak.cores},
                            {"clock_ghz", peak.clock_ghz},
                            {"clock_source", peak.clock_source},
                            {"f32_flop_per_cycle", peak.f32_flop_per_cycle},
                            {"bf16_flop_per_cycle", peak.bf16_flop_per_cycle},
                            {"f32_gflops", peak.gflops(0)},
                            {"bf16_gflops", peak.gflops(1)}}},
                          {"reps", c.reps},
                          {"packed_weight_bytes", packed_bytes},
                          {"results", nlohmann::json::array()}};
    for (const CaseResult& r : results) out["results"].push_back(to_json(r));
    if (!fp8.is_null()) out["fp8"] = fp8;
    for (const Goal& g : goals) out["goals"].push_back(g.to_json());
    std::printf("%s\n", out.dump(2).c_str());
  } else if (floats) {
    if (c.pack_weights) {
      std::printf("\nBF16 forward read weights packed beforehand: %.1f MiB%s\n",
                  static_cast<double>(packed_bytes) / (1 << 20),
                  packed_bytes == 0 ? " (this kernel set widens BF16: nothing to pack)" : "");
    }
    std::printf("\ngoals (best of %d interleaved repetitions per variant):\n", c.reps);
    for (const Goal& g : goals) g.print();
  }
  if (!c.plot_data.empty()) {
    FILE* f = std::fopen(c.plot_data.c_str(), "w");
    if (f == nullptr) throw Error(ErrorCode::IoError, "bench: cannot write " + quote(c.plot_data));
    std::fprintf(f,
                 "# shape rows routing op rows_per_expert dense loop_f32 grouplin_f32 loop_bf16 "
                 "grouplin_bf16 (GF/s)\n");
    for (const CaseResult& r : results) {
      std::fprintf(f, "%s %lld %s %s %g %g %g %g %g %g\n", r.shape.c_str(),
                   static_cast<long long>(r.rows), r.routing.c_str(), r.op.c_str(),
                   static_cast<double>(r.rows) / static_cast<double>(r.experts),
                   gflops(r.flops, r.dense_s), gflops(r.flops, r.loop_s[0]),
                   gflops(r.flops, r.grouplin_s[0]), gflops(r.flops, r.loop_s[1]),
                   gflops(r.flops, r.grouplin_s[1]));
    }
    std::fclose(f);
  }
}

}  // namespace grouplin::bench
