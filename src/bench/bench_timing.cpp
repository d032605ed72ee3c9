// Timing and inputs of `grouplin bench` (bench_timing.hpp).
#include "bench/bench_timing.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

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

// Cycles per second of one core: 16 dependent adds per step, so the chain, not the loop, sets the
// pace; the fastest of 16 windows of ~1 ms, since time taken from the core (a VM's other guests,
// interrupts) only ever slows a window down. 0 on an architecture without the chain.
double one_core_clock_hz() {
#if defined(__x86_64__) || defined(__aarch64__)
  constexpr int64_t kSteps = 1 << 18;  // 4M cycles: ~1.2 ms at 3.5 GHz
  double best = 0;
  for (int window = 0; window < 16; ++window) {
    uint64_t x = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < kSteps; ++i) {
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) {
#if defined(__x86_64__)
        asm volatile("add $1, %0" : "+r"(x));
#else
        asm volatile("add %0, %0, #1" : "+r"(x));
#endif
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0 && x == 16 * static_cast<uint64_t>(kSteps)) best = std::max(best, 16.0 * kSteps / s);
  }
  return best;
#else
  return 0.0;
#endif
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

double measured_clock_ghz(int threads) {
  std::vector<double> hz(static_cast<size_t>(std::max(threads, 1)));
  std::vector<std::thread> others;
  for (size_t t = 1; t < hz.size(); ++t)
    others.emplace_back([&hz, t] { hz[t] = one_core_clock_hz(); });
  hz[0] = one_core_clock_hz();
  for (std::thread& t : others) t.join();
  double sum = 0;
  for (double h : hz) {
    if (h <= 0) return 0.0;
    sum += h;
  }
  return sum / static_cast<double>(hz.size()) * 1e-9;
}

std::string cpuinfo_field(const char* key) {
  std::string value;
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      const std::string s(line);
      const size_t colon = s.find(':');
      if (s.rfind(key, 0) == 0 && colon != std::string::npos) {
        value = s.substr(std::min(colon + 2, s.size()));
        value.erase(value.find_last_not_of("\n") + 1);
        break;
      }
    }
    std::fclose(f);
  }
  return value;
}

std::string machine_description() {
  std::string cpu = cpuinfo_field("model name");
  if (cpu.empty()) cpu = "unknown CPU";
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
