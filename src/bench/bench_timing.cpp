// Timing and inputs of `grouplin bench` (bench_timing.hpp).
#include "bench/bench_timing.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "bench/bench_baselines.hpp"
#include "kernels/micro_kernels.hpp"
#include "kernels/thread_pool.hpp"

namespace grouplin::bench {
namespace {

// Calls shorter than this are timed in batches.
constexpr double kMinTimedSeconds = 2e-3;

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void time_variants(const std::vector<Variant>& variants, int reps) {
  // Variants whose call takes less than kMinTimedSeconds are timed as batches of back-to-back
  // calls (the batch's mean per call): one call of ~100 us varies 2x from run to run on this
  // machine (waking a sleeping thread alone costs ~40 us), more than the variants differ. Two
  // calls of each variant warm it up, and the faster sets its batch size (a first call often took
  // 1.5-3x as long: cold caches, sleeping threads).
  std::vector<int> batch(variants.size(), 1);
  for (size_t i = 0; i < variants.size(); ++i) {
    const double once = std::min(seconds_of(variants[i].run), seconds_of(variants[i].run));
    if (variants[i].uses_blas) bench::let_blas_threads_sleep();
    batch[i] = static_cast<int>(std::clamp(std::ceil(kMinTimedSeconds / once), 1.0, 32.0));
  }
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t i = 0; i < variants.size(); ++i) {
      const Variant& v = variants[i];
      const double s = seconds_of([&] {
        for (int k = 0; k < batch[i]; ++k) v.run();
      });
      *v.best = std::min(*v.best, s / batch[i]);
      if (v.uses_blas) bench::let_blas_threads_sleep();
    }
  }
}

// Rows per expert: uniform (remainder to the first experts), skewed (half to expert 0, the rest
// uniform over the others), empty25 (every fourth expert empty, the rest uniform), one (all rows
// to expert 0).
std::vector<int64_t> make_splits(const std::string& routing, int64_t experts, int64_t rows) {
  std::vector<int64_t> splits(static_cast<size_t>(experts), 0);
  std::vector<size_t> takers;
  int64_t left = rows;
  if (routing == "one" || experts == 1) {
    splits[0] = rows;
    return splits;
  }
  if (routing == "skewed") {
    splits[0] = rows / 2;
    left -= rows / 2;
  }
  for (size_t e = 0; e < splits.size(); ++e) {
    if (routing == "skewed" && e == 0) continue;
    if (routing == "empty25" && e % 4 == 3) continue;
    takers.push_back(e);
  }
  const auto n = static_cast<int64_t>(takers.size());
  for (int64_t i = 0; i < n; ++i)
    splits[takers[static_cast<size_t>(i)]] += left / n + (i < left % n ? 1 : 0);
  return splits;
}

// Deterministic values in [-1, 1): cheap enough to fill gigabytes.
Tensor filled(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::zeros(shape, DType::F32);
  float* p = t.mutable_data_as<float>();
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = static_cast<float>(static_cast<int64_t>(s >> 40) - (int64_t{1} << 23)) * 0x1p-23f;
  }
  return t;
}

std::vector<Tensor> experts_of(const Tensor& stacked) {
  std::vector<Tensor> v;
  for (int64_t e = 0; e < stacked.dim(0); ++e) v.push_back(stacked.select(e));
  return v;
}

std::string machine_description() {
  std::string cpu = "unknown CPU";
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      std::string s(line);
      if (s.rfind("model name", 0) == 0) {
        cpu = s.substr(s.find(':') + 2);
        cpu.erase(cpu.find_last_not_of("\n") + 1);
        break;
      }
    }
    std::fclose(f);
  }
  double load = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  char text[768];
  std::snprintf(text, sizeof text,
                "%s, %u hardware threads, %d GroupLin threads, kernels %s, %s, load %.2f",
                cpu.c_str(), std::thread::hardware_concurrency(), kernels::num_threads(),
                kernels::micro_kernels().name, blas_description(), load);
  return text;
}

}  // namespace grouplin::bench
