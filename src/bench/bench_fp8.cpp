// The FP8 cases of grouplin bench (bench_fp8.hpp).
#include "bench/bench_fp8.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "bench/bench_baselines.hpp"
#include "bench/bench_timing.hpp"
#include "grouplin/grouped_linear.hpp"
#include "kernels/grouped_gemm.hpp"

namespace grouplin::bench {
namespace {

constexpr double kMaxDecodeRows = 4;  // the goal's few rows per expert
constexpr double kFp8VsBf16 = 1.7;    // FP8 weights against BF16 weights
constexpr double kVsCopy = 0.80;      // FP8 weight traffic against a copy of those bytes

struct Fp8Case {
  std::string shape, op;
  int64_t experts = 0, in = 0, out = 0, rows_per_expert = 0;
  double flops = 0, fp8_bytes = 0;
  double bf16_s = kNotRun, fp8_s = kNotRun, copy_s = kNotRun;

  double gflops(double s) const { return s == kNotRun ? 0 : flops / s * 1e-9; }
  double gbytes(double s) const { return s == kNotRun ? 0 : fp8_bytes / s * 1e-9; }
  double vs_bf16() const { return fp8_s == kNotRun || bf16_s == kNotRun ? 0 : bf16_s / fp8_s; }
  double vs_copy() const { return gbytes(copy_s) > 0 ? gbytes(fp8_s) / gbytes(copy_s) : 0; }
};

// One shape's two weight sets (the same draws: BF16, and FP8 quantized per block) and buffers.
struct Fp8Data {
  GroupedLinear bf16, fp8;
  std::vector<Tensor> bf16_w, fp8_w, fp8_s;
  Tensor x, dy, y, dx, copy_dst;

  static GroupedLinearOptions options(const Fp8Shape& s, DType params) {
    GroupedLinearOptions o;
    o.num_gemms = s.experts;
    o.in_features = s.in;
    o.out_features = s.out;
    o.bias = false;
    o.params_dtype = params;
    o.activation_dtype = DType::BF16;
    o.weight_layout = WeightLayout::Single;
    o.seed = 1;
    return o;
  }
  Fp8Data(const Fp8Shape& s, int64_t max_rows)
      : bf16(options(s, DType::BF16)), fp8(options(s, DType::F8_E4M3)) {
    for (int64_t e = 0; e < s.experts; ++e) {
      bf16_w.push_back(bf16.expert_weight(e));
      fp8_w.push_back(fp8.expert_weight(e));
      fp8_s.push_back(fp8.expert_weight_scale(e));
    }
    x = filled({max_rows, s.in}, 3).to(DType::BF16);
    dy = filled({max_rows, s.out}, 4).to(DType::BF16);
    y = Tensor::zeros({max_rows, s.out}, DType::BF16);
    dx = Tensor::zeros({max_rows, s.in}, DType::BF16);
    copy_dst = Tensor::zeros({s.experts, s.out, s.in}, DType::F8_E4M3);
  }
};

Fp8Case run_case(const Fp8Shape& s, Fp8Data& d, int64_t per_expert, const std::string& op,
                 int reps) {
  Fp8Case r{s.name, op, s.experts, s.in, s.out, per_expert};
  const int64_t rows = per_expert * s.experts;
  const std::vector<int64_t> splits = make_splits("uniform", s.experts, rows);
  r.flops =
      2.0 * static_cast<double>(rows) * static_cast<double>(s.in) * static_cast<double>(s.out);
  const double scale_bytes = static_cast<double>(d.fp8_s[0].nbytes());
  r.fp8_bytes = static_cast<double>(s.experts) *
                (static_cast<double>(s.in) * static_cast<double>(s.out) + scale_bytes);
  Tensor x = d.x.rows(0, rows), dy = d.dy.rows(0, rows);
  Tensor y = d.y.rows(0, rows), dx = d.dx.rows(0, rows);
  const size_t copy_bytes = static_cast<size_t>(s.experts * s.in * s.out);
  std::vector<Variant> variants = {
      {&r.bf16_s,
       [&] {
         if (op == "forward") kernels::grouped_forward(x, splits, d.bf16_w, {}, {}, y);
         if (op == "dgrad") kernels::grouped_dgrad(dy, splits, d.bf16_w, {}, dx);
       },
       false},
      {&r.fp8_s,
       [&] {
         if (op == "forward") kernels::grouped_forward(x, splits, d.fp8_w, d.fp8_s, {}, y);
         if (op == "dgrad") kernels::grouped_dgrad(dy, splits, d.fp8_w, d.fp8_s, dx);
       },
       false},
      {&r.copy_s, [&] { parallel_copy(d.fp8_w[0].data(), d.copy_dst.mutable_data(), copy_bytes); },
       false}};
  time_variants(variants, reps);
  return r;
}

// Bytes of the CPU's L3 cache (0: unknown), from Linux's sysfs (the C library's figure can be
// wrong in virtual machines: 320 MiB for a 32 MiB L3 on one), else the C library's. The goal is
// for memory-bound decoding: BF16 weights that stay in this cache are read at cache speed, so the
// cases whose BF16 weights do not fit are counted apart as well.
int64_t l3_bytes() {
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level(dir + "level"), size(dir + "size");
    int l = 0;
    int64_t kib = 0;
    std::string unit;
    if (!(level >> l)) break;
    if (l == 3 && (size >> kib >> unit) && unit == "K") return kib << 10;
  }
#if defined(_SC_LEVEL3_CACHE_SIZE)
  const long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return v > 0 ? v : 0;
#else
  return 0;
#endif
}

// The name of a case in the goals' lines.
std::string case_name(const Fp8Case& r) {
  return r.shape + " " + std::to_string(r.rows_per_expert) + " rows/expert " + r.op;
}

}  // namespace

nlohmann::json run_fp8_bench(const std::vector<Fp8Shape>& shapes,
                             const std::vector<int64_t>& rows_per_expert,
                             const std::vector<std::string>& ops, int reps, bool json) {
  std::vector<Goal> goals = {{"FP8 weights >= 1.7 x BF16 weights (<= 4 rows/expert)", kFp8VsBf16},
                             {"FP8 weight traffic >= 0.80 x copy (<= 4 rows/expert)", kVsCopy},
                             {"  of those, BF16 weights larger than L3: FP8 >= 1.7x", kFp8VsBf16},
                             {"  of those, BF16 weights larger than L3: >= 0.80 copy", kVsCopy}};
  const int64_t l3 = l3_bytes();
  nlohmann::json out = {{"results", nlohmann::json::array()}, {"l3_bytes", l3}};
  if (!json) {
    std::printf(
        "\nFP8 weights (F8_E4M3, 128x128 F32 block scales) against the same BF16 weights, BF16 "
        "activations (L3: %lld MiB; * = the BF16 weights fit in it):\n%-9s %7s %-7s | %9s %8s "
        "%6s | %9s %9s %6s\n",
        static_cast<long long>(l3 >> 20), "shape", "rows/ex", "op", "BF16 GF/s", "FP8 GF/s",
        "xbf16", "FP8 GB/s", "copy GB/s", "xcopy");
  }
  for (const Fp8Shape& s : shapes) {
    Fp8Data data(s, s.experts * *std::max_element(rows_per_expert.begin(), rows_per_expert.end()));
    for (int64_t per_expert : rows_per_expert) {
      for (const std::string& op : ops) {
        if (op != "forward" && op != "dgrad") continue;  // FP8 weights have no wgrad
        const Fp8Case r = run_case(s, data, per_expert, op, reps);
        const bool past_l3 = 2 * s.experts * s.in * s.out > l3;
        if (per_expert <= kMaxDecodeRows) {
          goals[0].add(r.vs_bf16(), case_name(r));
          goals[1].add(r.vs_copy(), case_name(r));
          if (past_l3) {
            goals[2].add(r.vs_bf16(), case_name(r));
            goals[3].add(r.vs_copy(), case_name(r));
          }
        }
        out["results"].push_back({{"shape", r.shape},
                                  {"experts", r.experts},
                                  {"in", r.in},
                                  {"out", r.out},
                                  {"rows_per_expert", r.rows_per_expert},
                                  {"op", r.op},
                                  {"bf16_gflops", r.gflops(r.bf16_s)},
                                  {"fp8_gflops", r.gflops(r.fp8_s)},
                                  {"vs_bf16", r.vs_bf16()},
                                  {"fp8_gbytes", r.gbytes(r.fp8_s)},
                                  {"copy_gbytes", r.gbytes(r.copy_s)},
                                  {"vs_copy", r.vs_copy()},
                                  {"bf16_weights_past_l3", past_l3}});
        if (!json) {
          std::printf("%-8s%c %7lld %-7s | %9.1f %8.1f %6.2f | %9.1f %9.1f %6.2f\n",
                      r.shape.c_str(), past_l3 ? ' ' : '*',
                      static_cast<long long>(r.rows_per_expert), r.op.c_str(), r.gflops(r.bf16_s),
                      r.gflops(r.fp8_s), r.vs_bf16(), r.gbytes(r.fp8_s), r.gbytes(r.copy_s),
                      r.vs_copy());
          std::fflush(stdout);
        }
      }
    }
  }
  for (const Goal& g : goals) {
    out["goals"].push_back(g.to_json());
    if (!json) g.print();
  }
  return out;
}

}  // namespace grouplin::bench
