// `grouplin bench`: bad flag values are usage errors (exit 2, nothing measured), and a tiny run
// prints the JSON the docs describe. Timing is never asserted.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "kernels/isa.hpp"
#include "kernels/packed_weights.hpp"

namespace {

struct Output {
  int exit_code = -1;
  std::string out;
};

Output run_cli(const std::string& args) {
  Output o;
  const std::string cmd = std::string(GROUPLIN_CLI) + " bench " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return o;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) o.out.append(buf, n);
  const int status = pclose(p);
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

TEST(BenchCommandTest, BadValuesAreUsageErrors) {
  for (const char* args : {"--rows 0", "--rows 16,abc", "--shapes nope", "--routing sideways",
                           "--ops fwd", "--dtype f16", "--reps 0", "--threads 0", "--bogus"}) {
    const Output o = run_cli(args);
    EXPECT_EQ(o.exit_code, 2) << args;
    EXPECT_EQ(o.out.find("GF/s"), std::string::npos) << args << ": measured anyway";
  }
}

// The (rows per expert, op) of each FP8 case of a run's JSON, in order.
std::vector<std::pair<int64_t, std::string>> fp8_cases(const nlohmann::json& run) {
  std::vector<std::pair<int64_t, std::string>> seen;
  for (const auto& r : run["fp8"]["results"]) {
    seen.emplace_back(r["rows_per_expert"].get<int64_t>(), r["op"].get<std::string>());
  }
  return seen;
}

// A quick FP8 run on qwen3 with `flags`, its JSON (null when it failed, which is reported).
nlohmann::json quick_fp8_run(const std::string& flags) {
  const Output o =
      run_cli("--quick --shapes qwen3 --dtype fp8 --reps 1 --threads 2 --json " + flags);
  EXPECT_EQ(o.exit_code, 0) << o.out;
  return o.exit_code == 0 ? nlohmann::json::parse(o.out) : nlohmann::json();
}

// --dtype fp8 alone: only the FP8 cases (FP8 against the same BF16 weights and a copy of the FP8
// bytes), forward and dgrad (no wgrad for FP8 weights), at the quick rows per expert.
TEST(BenchCommandTest, Fp8RunComparesWithBf16AndCopy) {
  const nlohmann::json j = quick_fp8_run("--ops forward,wgrad,dgrad");
  ASSERT_FALSE(j.is_null());
  EXPECT_TRUE(j["results"].empty());
  const auto& fp8 = j["fp8"];
  ASSERT_EQ(fp8["results"].size(), 4u);  // 1 and 4 rows per expert x forward, dgrad
  for (const auto& r : fp8["results"]) {
    for (const char* k : {"bf16_gflops", "fp8_gflops", "fp8_gbytes", "copy_gbytes"}) {
      EXPECT_GT(r[k].get<double>(), 0.0) << k;
    }
    EXPECT_NEAR(r["vs_bf16"].get<double>(),
                r["fp8_gflops"].get<double>() / r["bf16_gflops"].get<double>(), 1e-9);
    EXPECT_NEAR(r["vs_copy"].get<double>(),
                r["fp8_gbytes"].get<double>() / r["copy_gbytes"].get<double>(), 1e-9);
  }
  const std::vector<std::pair<int64_t, std::string>> want = {
      {1, "forward"}, {1, "dgrad"}, {4, "forward"}, {4, "dgrad"}};
  EXPECT_EQ(fp8_cases(j), want);
  ASSERT_EQ(fp8["goals"].size(), 4u);
  EXPECT_EQ(fp8["goals"][0]["cases"], 4);
  // The last two goals count only the cases whose BF16 weights do not fit in the L3 cache (all
  // of them where the cache size is unknown).
  const int64_t l3 = fp8["l3_bytes"].get<int64_t>();
  int past_l3 = 0;
  for (const auto& r : fp8["results"]) {
    const int64_t bytes =
        2 * r["experts"].get<int64_t>() * r["in"].get<int64_t>() * r["out"].get<int64_t>();
    EXPECT_EQ(r["bf16_weights_past_l3"].get<bool>(), bytes > l3) << bytes << " vs " << l3;
    past_l3 += bytes > l3 ? 1 : 0;
  }
  EXPECT_EQ(fp8["goals"][2]["cases"], past_l3);
  EXPECT_EQ(fp8["goals"][3]["cases"], past_l3);
}

// --fp8-rows chooses the FP8 cases' rows per expert (over --quick's); the goals count only the
// cases of at most 4 rows per expert. A row count outside 1-4096 is a usage error.
TEST(BenchCommandTest, Fp8RowsChoosesTheRowsPerExpert) {
  const nlohmann::json j = quick_fp8_run("--ops forward,dgrad --fp8-rows 3,8");
  ASSERT_FALSE(j.is_null());
  const std::vector<std::pair<int64_t, std::string>> want = {
      {3, "forward"}, {3, "dgrad"}, {8, "forward"}, {8, "dgrad"}};
  EXPECT_EQ(fp8_cases(j), want);
  EXPECT_EQ(j["fp8"]["goals"][0]["cases"], 2);
  EXPECT_EQ(run_cli("--dtype fp8 --fp8-rows 0").exit_code, 2);
}

// --pack-weights packs the BF16 weights once where the kernels read them packed (and says how
// many bytes), nothing elsewhere; without it nothing is packed.
TEST(BenchCommandTest, PackWeightsPacksWhereTheKernelsReadPackedWeights) {
  const std::string run =
      "--quick --shapes qwen3 --rows 512 --routing uniform --ops forward --dtype bf16 --reps 1 "
      "--threads 2 --json";
  const Output packed = run_cli(run + " --pack-weights"), plain = run_cli(run);
  ASSERT_EQ(packed.exit_code, 0) << packed.out;
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  const nlohmann::json p = nlohmann::json::parse(packed.out), u = nlohmann::json::parse(plain.out);
  EXPECT_EQ(u["packed_weight_bytes"], 0);
  ASSERT_EQ(p["results"].size(), 1u);
  const auto& r = p["results"][0];
  EXPECT_GT(r["bf16"]["grouplin_gflops"].get<double>(), 0.0);
  if (grouplin::kernels::forward_weights_packable(grouplin::DType::BF16, grouplin::DType::BF16)) {
    // Every expert's BF16 weights, as pairs: at least their bytes.
    EXPECT_GE(p["packed_weight_bytes"].get<size_t>(),
              r["experts"].get<size_t>() * r["in"].get<size_t>() * r["out"].get<size_t>() * 2);
  } else {
    EXPECT_EQ(p["packed_weight_bytes"], 0) << "packed for kernels that widen BF16";
  }
}

TEST(BenchCommandTest, TinyRunPrintsResultsAndGoalsAsJson) {
  const Output o = run_cli(
      "--quick --shapes qwen3 --rows 16 --routing skewed --ops forward,bgrad "
      "--dtype f32,bf16 --threads 2 --json");
  ASSERT_EQ(o.exit_code, 0) << o.out;
  const nlohmann::json j = nlohmann::json::parse(o.out);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& r : j["results"]) {
    EXPECT_EQ(r["shape"], "qwen3");
    EXPECT_EQ(r["rows"], 16);
    EXPECT_EQ(r["routing"], "skewed");
    EXPECT_TRUE(r["memory_bound"].get<bool>());
    for (const char* dt : {"f32", "bf16"}) {
      EXPECT_GT(r[dt]["grouplin_gflops"].get<double>(), 0.0) << dt;
      EXPECT_GT(r[dt]["vs_loop"].get<double>(), 0.0) << dt;
      EXPECT_GT(r[dt]["vs_copy"].get<double>(), 0.0) << dt;
    }
    EXPECT_EQ(r.contains("dense_gflops"), r["op"] == "forward");
    // The routing itself, for peers that run the same case: half the rows to expert 0.
    const auto splits = r["m_splits"].get<std::vector<int64_t>>();
    ASSERT_EQ(splits.size(), r["experts"].get<size_t>());
    EXPECT_EQ(splits[0], 8);
    EXPECT_EQ(std::accumulate(splits.begin(), splits.end(), int64_t{0}), 16);
  }
  EXPECT_EQ(j["goals"].size(), 5u);
  // Each figure as a fraction of its path's peak (cores x clock x FLOP per cycle), where the
  // clock is known: vs_peak is grouplin_gflops over that peak; bgrad (additions) has none.
  const auto& peak = j["peak"];
  EXPECT_EQ(peak["cores"], 2);
  // The clock is measured (a chain of dependent adds), not the one /proc/cpuinfo reports, which
  // under a VM is often the nominal clock and put fractions of peak above 1.
  EXPECT_EQ(peak["clock_source"], "measured: dependent adds on every thread");
  EXPECT_GT(peak["clock_ghz"].get<double>(), 0.2);
  EXPECT_LT(peak["clock_ghz"].get<double>(), 10.0);
  const std::string kernels = j["kernels"];
  const int zmm = grouplin::kernels::detect_cpu().zmm_halves ? 32 : 64;  // Zen 4: two halves
  const int f32_flop = kernels == "portable" ? 0 : kernels == "avx2+fma" ? 32 : zmm;
  EXPECT_EQ(peak["f32_flop_per_cycle"], f32_flop);
  EXPECT_EQ(peak["bf16_flop_per_cycle"], kernels == "amx-bf16"     ? 1024
                                         : kernels == "avx512bf16" ? 2 * zmm
                                                                   : f32_flop);
  for (const auto& r : j["results"]) {
    for (const char* dt : {"f32", "bf16"}) {
      const double peak_gflops = peak[std::string(dt) + "_gflops"].get<double>();
      if (r["op"] == "bgrad" || peak_gflops <= 0) {
        EXPECT_FALSE(r[dt].contains("vs_peak")) << dt;
        continue;
      }
      EXPECT_NEAR(r[dt]["vs_peak"].get<double>(),
                  r[dt]["grouplin_gflops"].get<double>() / peak_gflops, 1e-9)
          << dt;
    }
  }
}

}  // namespace
